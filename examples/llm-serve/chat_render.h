/* The chat prompt: a request's messages (and tools) through the chat
 * template, the model's own or the one given with --chat-template. */
#ifndef LLM_SERVE_CHAT_RENDER_H
#define LLM_SERVE_CHAT_RENDER_H

#include "request.h"
#include "server.h"
#include "tools.h"

/* The prompt text (caller frees), or NULL with `err` filled. `*fmt` is the
 * tool-call format of the reply: the one the template implies when it
 * renders the tools, else that of the fallback preamble, which is then
 * added to the system message. */
char *chat_render(server *srv, const serve_request *req, const tool_format **fmt, serve_error *err);

#endif
