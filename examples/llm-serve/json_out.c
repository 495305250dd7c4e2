#include "json_out.h"

cJSON *put_item(cJSON *obj, const char *name, cJSON *item, bool *ok)
{
    if (item && obj && cJSON_AddItemToObject(obj, name, item)) return item;
    cJSON_Delete(item);
    *ok = false;
    return NULL;
}

void push_item(cJSON *array, cJSON *item, bool *ok)
{
    if (item && array && cJSON_AddItemToArray(array, item)) return;
    cJSON_Delete(item);
    *ok = false;
}

cJSON *put_string(cJSON *obj, const char *name, const char *v, bool *ok)
{
    return put_item(obj, name, cJSON_CreateString(v), ok);
}

cJSON *put_number(cJSON *obj, const char *name, double v, bool *ok)
{
    return put_item(obj, name, cJSON_CreateNumber(v), ok);
}

void put_null(cJSON *obj, const char *name, bool *ok)
{
    put_item(obj, name, cJSON_CreateNull(), ok);
}

cJSON *put_array(cJSON *obj, const char *name, bool *ok)
{
    return put_item(obj, name, cJSON_CreateArray(), ok);
}

cJSON *put_object(cJSON *obj, const char *name, bool *ok)
{
    return put_item(obj, name, cJSON_CreateObject(), ok);
}
