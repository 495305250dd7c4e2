/* Building response JSON with cJSON when any allocation may fail. */
#ifndef LLM_SERVE_JSON_OUT_H
#define LLM_SERVE_JSON_OUT_H

#include <cJSON.h>
#include <stdbool.h>

/* cJSON tells of a failed allocation only by its return values; these
 * record it by clearing `*ok`, so that a response missing a field is never
 * sent. An item that could not be attached is freed; a NULL parent (itself
 * a failed allocation) is accepted and fails too. */
cJSON *put_item(cJSON *obj, const char *name, cJSON *item, bool *ok);
void push_item(cJSON *array, cJSON *item, bool *ok);
cJSON *put_string(cJSON *obj, const char *name, const char *v, bool *ok);
cJSON *put_number(cJSON *obj, const char *name, double v, bool *ok);
void put_null(cJSON *obj, const char *name, bool *ok);
cJSON *put_array(cJSON *obj, const char *name, bool *ok);
cJSON *put_object(cJSON *obj, const char *name, bool *ok);

#endif
