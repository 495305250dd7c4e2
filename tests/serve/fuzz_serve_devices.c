/* libFuzzer target: llm-serve's --devices list (device.c), the one
 * command-line value it parses itself. The input is the argument's text;
 * an accepted list holds 1..SERVE_MAX_DEVICES ids in [0, INT32_MAX] that
 * print back to an equivalent list, a refused one leaves no ids. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    serve_device d = {.backend = "cpu", .tensor_parallel = 1};
    if (serve_device_parse_list(&d, text)) {
        if (d.n_devices < 1 || d.n_devices > SERVE_MAX_DEVICES) abort();
        /* Printed back and parsed again, the ids are the same. */
        char again[SERVE_MAX_DEVICES * 12 + 1];
        size_t at = 0;
        for (uint32_t i = 0; i < d.n_devices; i++) {
            if (d.devices[i] < 0) abort();
            at += (size_t)snprintf(again + at, sizeof again - at, "%s%d", i ? "," : "",
                                   (int)d.devices[i]);
        }
        serve_device e = {0};
        if (!serve_device_parse_list(&e, again) || e.n_devices != d.n_devices ||
            memcmp(e.devices, d.devices, d.n_devices * sizeof d.devices[0]) != 0)
            abort();
    } else if (d.n_devices != 0) {
        abort();
    }
    free(text);
    return 0;
}
