/* Where the server's session runs: --device, --tp and --devices, read into
 * the library's llm_device_params (as llm-run does), and the backend that
 * name resolves to, shown in /v1/models and /metrics. */
#ifndef LLM_SERVE_DEVICE_H
#define LLM_SERVE_DEVICE_H

#include <stdbool.h>
#include <stdint.h>

#define SERVE_MAX_DEVICES 64

typedef struct serve_device {
    const char *backend;                /* --device: "cpu" (default), "cuda", "auto" */
    long tensor_parallel;               /* --tp, 1 by default */
    int32_t devices[SERVE_MAX_DEVICES]; /* --devices, n_devices of them */
    uint32_t n_devices;
} serve_device;

/* Reads --devices' comma-separated ids ("0,1") into `d`; false with a
 * message on stderr for an empty, malformed or too long list. */
bool serve_device_parse_list(serve_device *d, const char *text);

/* The backend a session created with `d` runs on: `d->backend` itself, or
 * for "auto" what the library picks by the rule llm.h states (the first
 * available backend other than "cpu" with enough devices, else "cpu").
 * Static storage. */
const char *serve_device_resolved_name(const serve_device *d);

#endif
