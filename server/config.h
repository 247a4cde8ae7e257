/* The server's configuration: every setting can come from a command-line flag, a KIRI_*
 * environment variable, or a config file (`--config FILE`, lines `key = value`, '#' comments,
 * keys spelled like the flags without the leading dashes), so device managers (systemd, IoT Edge,
 * Greengrass, KubeEdge) deploy kiri without wrappers. Precedence: flag > environment > file >
 * default. The environment name of a flag is KIRI_ plus its name upper-cased with '-' as '_'
 * (--kv-memory -> KIRI_KV_MEMORY). */
#ifndef KIRI_SERVER_CONFIG_H
#define KIRI_SERVER_CONFIG_H

#include <stddef.h>
#include <stdint.h>

struct kiri_server_config {
    char model[1024];           /* --model / -m: GGUF file */
    char model_alias[128];      /* --alias: the id /v1/models reports (default: file name) */
    char host[128];             /* --host (default 127.0.0.1) */
    int port;                   /* --port (default 8080) */
    int threads;                /* --threads / -t (default: cores) */
    char backend[32];           /* --backend (default auto) */
    int gpu_layers;             /* --gpu-layers: layers on a GPU backend, the rest on the CPU (default -1: all) */
    char cpu_kernels[16];       /* --cpu-kernels (default auto) */
    int32_t ctx;                /* --ctx: tokens per sequence (default: the model's) */
    uint64_t kv_memory;         /* --kv-memory: KV pool bytes, accepts K/M/G suffixes (default: ctx * parallel) */
    char kv_type[8];            /* --kv-type f16|f32|q8_0 */
    int parallel;               /* --parallel: sequences batched at once (default 8) */
    int32_t chunk;              /* --chunk: prompt tokens per step (default 256) */
    int queue;                  /* --queue: waiting requests before 429 (default 64) */
    char spec[8];               /* --spec none|ngram|draft|mtp: speculation for requests that do not say */
    char draft_model[1024];     /* --draft-model FILE: drafts for --model (same vocabulary) */
    int spec_max;               /* --spec-max: most drafted tokens at once (default 8) */
    int spec_max_seqs;          /* --spec-max-seqs: drafts only while this many decode (default 4) */
    char tls_cert[1024];        /* --tls-cert: PEM certificate (chain) */
    char tls_key[1024];         /* --tls-key: PEM private key (unencrypted) */
    char api_key_file[1024];    /* --api-key-file */
    uint64_t max_body;          /* --max-body bytes (default 4M) */
    int32_t max_prompt_tokens;  /* --max-prompt-tokens (default: ctx - 1) */
    double request_timeout;     /* --request-timeout seconds for one generation (default 600) */
    double idle_timeout;        /* --idle-timeout seconds to receive a request (default 10) */
    int http_threads;           /* --http-threads connection workers (default 64) */
    int log_prompts;            /* --log-prompts (default off) */
    char config_file[1024];     /* --config */
    char models_dir[1024];      /* --models-dir: serve every DIR/NAME.gguf as model NAME */
    uint64_t models_memory;     /* --models-memory: bytes for loaded models (files + KV); 0: no limit */
    char fleet_url[2048];       /* --fleet: https:// URL of the signed fleet manifest */
    char fleet_key[1024];       /* --fleet-key: the pinned public key (PEM) manifests must be signed with */
    char fleet_ca[1024];        /* --fleet-ca: CA bundle for the fleet's servers (default: the system's) */
    double fleet_interval;      /* --fleet-interval seconds between syncs (default 300) */
    char node_name[128];        /* --node-name: the name heartbeats report (default: the host name) */
    char upstream[2048];        /* --upstream: http(s) URL of an OpenAI-compatible cloud upstream */
    char upstream_key_file[1024];   /* --upstream-key-file: its API key (first line) */
    char upstream_ca[1024];     /* --upstream-ca: CA bundle for an https upstream (default: the system's) */
    char route[16];             /* --route local-first|cloud-first ("" : local-first) */
    int route_queue;            /* --route-queue: local-first forwards at this many waiting (0: --queue / 2) */
    double upstream_timeout;    /* --upstream-timeout seconds: first byte and silence (default 60) */
};

/* Fills cfg from defaults, the config file, the environment (envp, NULL-terminated, may be NULL)
 * and argv (argv[0] is the first option; no command name). Returns 0, or -1 with one sentence in
 * err naming the setting and its source. */
int kiri_server_config_load(struct kiri_server_config *cfg, int argc, char **argv, char **envp,
                            char *err, size_t err_cap);
/* Writes the flag help text. */
void kiri_server_config_usage(char *buf, size_t cap);
/* Whether argv (as for kiri_server_config_load) asks for help: -h or --help where a flag may stand. */
int kiri_server_config_help_requested(int argc, char **argv);

#endif
