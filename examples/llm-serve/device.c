/* --device, --tp, --devices: see device.h. */
#define LLM_EXPERIMENTAL
#include "device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"

bool serve_device_parse_list(serve_device *d, const char *text) {
    d->n_devices = 0;
    const char *p = text;
    for (;;) {
        char *end;
        errno = 0;
        long id = strtol(p, &end, 10);
        if (end == p || errno || id < 0 || id > INT32_MAX || (*end && *end != ',') ||
            d->n_devices == SERVE_MAX_DEVICES) {
            fprintf(stderr,
                    "llm-serve: --devices needs up to %d comma-separated device ids like "
                    "0,1, not '%s'\n",
                    SERVE_MAX_DEVICES, text);
            d->n_devices = 0;
            return false;
        }
        d->devices[d->n_devices++] = (int32_t)id;
        if (!*end)
            return true;
        p = end + 1;
    }
}

const char *serve_device_resolved_name(const serve_device *d) {
    const char *name = d->backend && d->backend[0] ? d->backend : "cpu";
    if (strcmp(name, "auto") != 0)
        return name;
    uint32_t wanted = d->tensor_parallel > 1 ? (uint32_t)d->tensor_parallel : 1;
    for (size_t i = 0; i < llm_backend_count(); i++) {
        llm_backend_info info = {sizeof info};
        if (llm_backend_get_info(i, &info) != LLM_OK)
            break;
        if (info.available && strcmp(info.name, "cpu") != 0 && info.n_devices >= wanted)
            return info.name;
    }
    return "cpu";
}
