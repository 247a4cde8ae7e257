/* `kiri serve`: the OpenAI-compatible HTTP(S) endpoint on CivetWeb over the continuous-batching
 * loop. The listener starts first (so /health answers 503 while the model loads), then the model,
 * then requests are served; stop drains running requests and closes the listener.
 *
 * Endpoints: POST /v1/completions, POST /v1/chat/completions (both with stream: true as
 * Server-Sent Events), GET /v1/models, POST /tokenize, POST /detokenize, GET /health,
 * GET /metrics, GET / (the chat page). With API keys configured, everything but /health and the
 * chat page itself needs "Authorization: Bearer KEY".
 */
#ifndef KIRI_SERVER_H
#define KIRI_SERVER_H

struct kiri_server;
struct kiri_server_config;
struct kiri_status_info;

/* Starts listening and loads the model. The configuration is copied. */
int kiri_server_start(const struct kiri_server_config *cfg, struct kiri_server **out,
                      struct kiri_status_info *info);
/* Stops taking requests, lets running ones finish (at most grace_seconds), closes the listener
 * and frees everything. */
void kiri_server_stop(struct kiri_server *s, double grace_seconds);

#endif
