/* Heartbeats (heartbeat.h): the status document, built with Jansson, and its POST. */
#include "heartbeat.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "https.h"
#include "kiri.h"
#include "mem.h"
#include "platform.h"

#define HEARTBEAT_MAX_REPLY (64u << 10)   /* the collector's answer is read and dropped */

static json_t *str(const char *s) { return json_string(s ? s : ""); }

/* The status as an owned NUL-terminated JSON string (kiri_mem_free); NULL when out of memory. */
static char *heartbeat_json(const struct kiri_heartbeat_status *s)
{
    json_t *models = json_array();
    const int n = s->n_models < 0 ? 0 : s->n_models > KIRI_HEARTBEAT_MAX_MODELS ? KIRI_HEARTBEAT_MAX_MODELS : s->n_models;
    for (int i = 0; models && i < n; i++)
        json_array_append_new(models, json_pack("{s:o, s:o, s:b}", "name", str(s->models[i].name), "sha256",
                                                str(s->models[i].sha256_hex), "loaded", s->models[i].loaded));
    json_t *o = json_pack("{s:o, s:o, s:I, s:o, s:f, s:{s:i, s:i, s:I, s:I}, s:{s:I, s:I, s:I, s:I}, s:o}",
                          "kiri_version", str(s->kiri_version), "node", str(s->node), "manifest_version",
                          (json_int_t)s->manifest_version, "backend", str(s->backend), "uptime_seconds",
                          s->uptime_seconds, "requests", "running", (int)s->running, "waiting", (int)s->waiting,
                          "total", (json_int_t)s->requests_total, "errors", (json_int_t)s->request_errors, "fleet",
                          "manifest_rejections", (json_int_t)s->manifest_rejections, "model_load_failures",
                          (json_int_t)s->model_load_failures, "model_swaps", (json_int_t)s->model_swaps,
                          "heartbeat_failures", (json_int_t)s->heartbeat_failures, "models",
                          models ? models : json_array());
    if (!o)
        return NULL;
    /* Jansson's strings come from malloc or from kiri_mem_alloc (the server routes Jansson through
     * it); kiri_mem_free is free() either way. */
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return text;
}

static int drop_body(void *user, const struct kiri_https_response *r, const void *data, size_t n)
{
    (void)user;
    (void)r;
    (void)data;
    (void)n;
    return 0;
}

int kiri_heartbeat_send(struct kiri_https_client *c, const char *url, const struct kiri_heartbeat_status *s,
                        int *http_status, struct kiri_status_info *info)
{
    *http_status = 0;
    char *body = heartbeat_json(s);
    if (!body)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    struct kiri_https_request req;
    memset(&req, 0, sizeof req);
    req.url = url;
    req.method = "POST";
    req.body = body;
    req.body_len = strlen(body);
    req.content_type = "application/json";
    req.max_body = HEARTBEAT_MAX_REPLY;
    struct kiri_https_response resp;
    int rc = kiri_https_send(c, &req, drop_body, NULL, &resp, info);
    kiri_mem_free(body);
    *http_status = resp.status;
    if (rc == KIRI_OK && (resp.status < 200 || resp.status > 299))
        rc = kiri_error_at(info, KIRI_E_IO, "status", -1, "the heartbeat collector answered %d", resp.status);
    return rc;
}

void kiri_heartbeat_hostname(char *out, size_t cap)
{
    static const char *const files[] = {"/proc/sys/kernel/hostname", "/etc/hostname"};
    if (!cap)
        return;
    out[0] = '\0';
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char *text = NULL;
        size_t len = 0;
        struct kiri_status_info info;
        if (kiri_platform_read_file(files[i], 4096, &text, &len, &info) != KIRI_OK)
            continue;
        size_t n = 0;
        while (n < len && n + 1 < cap && text[n] != '\n' && text[n] != '\r' && text[n] != '\0')
            n++;
        memcpy(out, text, n);
        out[n] = '\0';
        kiri_mem_free(text);
        if (n)
            return;
    }
}
