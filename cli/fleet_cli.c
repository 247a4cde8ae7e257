/* `kiri pull` and `kiri fleet keygen | sign | verify | sync` (fleet_cli.h). */
#include "fleet_cli.h"

#include <stddef.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "download.h"
#include "error.h"
#include "fleet.h"
#include "hex.h"
#include "https.h"
#include "kiri.h"
#include "manifest.h"
#include "mem.h"
#include "names.h"
#include "oci.h"
#include "options.h"
#include "net_platform.h"

#define KEY_FILE_MAX (64u << 10)

/* ---------------------------------------------------------------------------------------------
 * Options: one table per verb, from shared groups (base/options.h)
 * ------------------------------------------------------------------------------------------- */

struct opts {
    const char *out, *key, *models_dir, *manifest_url, *manifest_file, *sha256, *name;   /* borrowed from argv */
    const char *pubkeys[KIRI_MANIFEST_MAX_KEYS];
    int n_pubkeys;
    const char *allow[KIRI_HTTPS_MAX_ALLOW_HOSTS];
    int n_allow;
    const char *allow_hosts[KIRI_HTTPS_MAX_ALLOW_HOSTS + 1];   /* allow, NULL-terminated */
    uint64_t size;
    int json;
    struct kiri_fleet_options fo;
};

#define O(m) KIRI_OPTION_FIELD(struct opts, m)
#define REF(n, m, a, h) {.name = n, .type = KIRI_OPTION_STRING_REF, O(m), .arg = a, .help = h}
#define MODELS_DIR REF("models-dir", models_dir, "DIR", "The models directory.")
#define JSON {.name = "json", .type = KIRI_OPTION_FLAG, O(json), .help = "Prints one JSON object."}
#define PUBKEY                                                                                     \
    {.name = "pubkey", .type = KIRI_OPTION_STRINGS, O(pubkeys), .count_off = offsetof(struct opts, n_pubkeys), \
     .arg = "PUBLIC.pem", .help = "A public key manifests may be signed with (repeatable, up to 8)."}
#define SECONDS(n, m, lo, hi, h, d) \
    {.name = n, .type = KIRI_OPTION_SECONDS, O(m), .flo = lo, .fhi = hi, .arg = "S", .help = h, .def = d}

static const struct kiri_option manifest_opts[] = {
    SECONDS("skew", fo.skew, 0, 1e9, "Clock error tolerated for the manifest's expiry, in seconds.", "300"),
    {.name = "max-version-jump", .type = KIRI_OPTION_INT, O(fo.max_version_jump), .lo = 1,
     .hi = 9007199254740991, .arg = "N", .help = "The largest version step accepted.", .def = "1048576"},
};

static const struct kiri_option network_opts[] = {
    REF("ca", fo.https.ca_file, "FILE", "The trusted CA bundle (PEM). Default: " KIRI_HTTPS_SYSTEM_CA "."),
    {.name = "allow-host", .type = KIRI_OPTION_STRINGS, O(allow), .count_off = offsetof(struct opts, n_allow),
     .arg = "HOST", .help = "A host redirects and token realms may lead to (repeatable, up to 16)."},
    {.name = "retries", .type = KIRI_OPTION_INT, O(fo.max_attempts), .lo = 1, .hi = 100, .arg = "N",
     .help = "Attempts per download.", .def = "5"},
    SECONDS("backoff", fo.backoff_base, 0.001, 3600, "The first wait between attempts, doubling after each.", "1"),
    SECONDS("backoff-max", fo.backoff_max, 0.001, 86400, "The longest wait, a server's Retry-After included.",
            "300"),
    {.name = "disk-margin", .type = KIRI_OPTION_SIZE, O(fo.disk_margin), .lo = 0, .hi = (int64_t)1 << 50,
     .arg = "BYTES", .help = "Free space to keep beyond a download, with K, M or G suffixes.", .def = "64M"},
    SECONDS("connect-timeout", fo.https.connect_timeout, 0.01, 3600, "The longest TCP connect.", "10"),
    SECONDS("first-byte-timeout", fo.https.first_byte_timeout, 0.01, 3600,
            "The longest wait from connecting to the end of the response head.", "30"),
    SECONDS("idle-timeout", fo.https.idle_timeout, 0.01, 3600, "The longest silence inside a response body.", "30"),
    {.name = "min-rate", .type = KIRI_OPTION_FLOAT, O(fo.https.min_rate), .flo = -1, .fhi = 1e12, .arg = "BYTES/S",
     .help = "The slowest transfer accepted over --rate-window; 0 is the default, -1 checks none.", .def = "1024"},
    SECONDS("rate-window", fo.https.rate_window, 0.01, 3600, "The window --min-rate is measured over.", "30"),
};

static const struct kiri_option keygen_opts[] = {
    REF("out", out, "DIR", "Writes DIR/fleet-key.pem (private, mode 0600) and DIR/fleet-pub.pem."),
};
static const struct kiri_option sign_opts[] = {
    REF("key", key, "PRIVATE.pem", "The private key to sign with."),
};
static const struct kiri_option verify_opts[] = {
    PUBKEY,
    REF("models-dir", models_dir, "DIR", "Also checks the version against the one the directory holds."),
};
static const struct kiri_option sync_opts[] = {
    PUBKEY,
    MODELS_DIR,
    REF("manifest-url", manifest_url, "URL", "The https:// URL of the signed manifest."),
    REF("manifest-file", manifest_file, "FILE", "A signed manifest at hand (instead of --manifest-url)."),
    {.name = "verify-installed", .type = KIRI_OPTION_FLAG, O(fo.verify_installed),
     .help = "Hashes installed models again instead of trusting the state file."},
    JSON,
};
static const struct kiri_option pull_opts[] = {
    MODELS_DIR,
    REF("sha256", sha256, "HEX", "The file's SHA-256 (required for an https:// URL)."),
    {.name = "size", .type = KIRI_OPTION_SIZE, O(size), .lo = 0, .hi = (int64_t)1 << 50, .arg = "BYTES",
     .help = "The file's size (for an https:// URL; asked from the server when not given)."},
    REF("name", name, "NAME", "The model's name in the directory (default: from REF)."),
    JSON,
};

#define GROUP(title, opts) {title, opts, sizeof opts / sizeof opts[0]}
static const struct kiri_option_group keygen_groups[] = {GROUP(NULL, keygen_opts)};
static const struct kiri_option_group sign_groups[] = {GROUP(NULL, sign_opts)};
static const struct kiri_option_group verify_groups[] = {GROUP(NULL, verify_opts),
                                                         GROUP("manifest options", manifest_opts)};
static const struct kiri_option_group sync_groups[] = {
    GROUP(NULL, sync_opts), GROUP("manifest options", manifest_opts), GROUP("network options", network_opts)};
static const struct kiri_option_group pull_groups[] = {GROUP(NULL, pull_opts),
                                                       GROUP("network options", network_opts)};

struct verb {
    const char *name;        /* "pull", "fleet sync" */
    const char *synopsis;
    const char *summary;
    struct kiri_option_spec spec;
    int (*run)(struct opts *o, const char **args, int n_args);
};

static int cmd_keygen(struct opts *o, const char **args, int n_args);
static int cmd_sign(struct opts *o, const char **args, int n_args);
static int cmd_verify(struct opts *o, const char **args, int n_args);
static int cmd_sync(struct opts *o, const char **args, int n_args);
static int cmd_pull(struct opts *o, const char **args, int n_args);

#define SPEC(groups, max_positional) {groups, sizeof groups / sizeof groups[0], NULL, NULL, max_positional}
static const struct verb verbs[] = {
    {"fleet keygen", "--out DIR", "makes a signing key pair and prints its key id", SPEC(keygen_groups, 0),
     cmd_keygen},
    {"fleet sign", "--key PRIVATE.pem MANIFEST.json > SIGNED.json", "signs a manifest", SPEC(sign_groups, 1),
     cmd_sign},
    {"fleet verify", "--pubkey PUBLIC.pem [--pubkey ...] SIGNED.json [--models-dir DIR]",
     "checks the signature, the expiry and (with --models-dir) the version against the stored mark",
     SPEC(verify_groups, 1), cmd_verify},
    {"fleet sync", "--pubkey PEM --models-dir DIR (--manifest-url URL | --manifest-file FILE)",
     "installs the models a signed manifest lists", SPEC(sync_groups, 0), cmd_sync},
    {"pull", "REF --models-dir DIR [--sha256 HEX] [--size BYTES] [--name NAME] [options]",
     "fetches a model: REF is host[:port]/repo[:tag|@sha256:HEX] (OCI) or an https:// URL",
     SPEC(pull_groups, 1), cmd_pull},
};
#define N_VERBS (sizeof verbs / sizeof verbs[0])

static void verb_usage(FILE *f, const struct verb *v)
{
    static char text[16384];
    kiri_options_usage(&v->spec, text, sizeof text);
    fprintf(f, "usage: kiri %s %s\n  %s\n\n%s", v->name, v->synopsis, v->summary, text);
}

/* kiri fleet --help: every verb's synopsis, then the option groups they share. */
static void fleet_usage(FILE *f)
{
    fprintf(f, "usage:\n");
    for (size_t i = 0; i < N_VERBS; i++)
        fprintf(f, "  kiri %s %s\n      %s\n", verbs[i].name, verbs[i].synopsis, verbs[i].summary);
    static const struct kiri_option_group shared[] = {GROUP("manifest options", manifest_opts),
                                                      GROUP("network options", network_opts)};
    static const struct kiri_option_spec spec = SPEC(shared, 0);
    static char text[16384];
    kiri_options_usage(&spec, text, sizeof text);
    fprintf(f, "\n`kiri fleet VERB --help` and `kiri pull --help` list each verb's options.\n\n%s", text);
}

/* Parses argv from index first for v and runs it. */
static int run_verb(const struct verb *v, int argc, char **argv, int first)
{
    if (kiri_options_help_requested(&v->spec, argc - first, argv + first)) {
        verb_usage(stdout, v);
        return 0;
    }
    struct opts o;
    memset(&o, 0, sizeof o);
    kiri_fleet_options_default(&o.fo);
    const char *args[2];
    int n_args = 0;
    char err[512];
    if (kiri_options_parse(&v->spec, &o, argc - first, argv + first, NULL, args, &n_args, err, sizeof err)) {
        fprintf(stderr, "kiri: error: %s (see kiri %s --help)\n", err, v->name);
        return 2;
    }
    memcpy(o.allow_hosts, o.allow, (size_t)o.n_allow * sizeof o.allow[0]);
    o.allow_hosts[o.n_allow] = NULL;
    o.fo.https.allow_hosts = o.n_allow ? o.allow_hosts : NULL;
    return v->run(&o, args, n_args);
}

static int fail(const char *what, const struct kiri_status_info *info)
{
    if (info->field[0])
        fprintf(stderr, "kiri: error: %s: %s [%s, %s]\n", what, info->message, kiri_status_name(info->code), info->field);
    else
        fprintf(stderr, "kiri: error: %s: %s [%s]\n", what, info->message, kiri_status_name(info->code));
    return 1;
}

static void log_line(void *user, const char *line)
{
    (void)user;
    fprintf(stderr, "kiri: fleet: %s\n", line);
}

static int load_keys(const struct opts *o, struct kiri_manifest_keys **out)
{
    if (o->n_pubkeys == 0) {
        fprintf(stderr, "kiri: error: --pubkey PUBLIC.pem is required (the key manifests must be signed with)\n");
        return 2;
    }
    struct kiri_manifest_keys *k = NULL;
    if (kiri_manifest_keys_init(&k) != KIRI_OK) {
        fprintf(stderr, "kiri: error: out of memory\n");
        return 1;
    }
    for (int i = 0; i < o->n_pubkeys; i++) {
        struct kiri_status_info info;
        char *pem = NULL;
        size_t len = 0;
        int rc = kiri_platform_read_file(o->pubkeys[i], KEY_FILE_MAX, &pem, &len, &info);
        if (rc == KIRI_OK)
            rc = kiri_manifest_keys_add(k, pem, len, &info);
        kiri_mem_free(pem);
        if (rc != KIRI_OK) {
            kiri_manifest_keys_free(k);
            return fail(o->pubkeys[i], &info);
        }
    }
    *out = k;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * keygen, sign, verify
 * ------------------------------------------------------------------------------------------- */

static int write_file(const char *path, const char *text, int private_key, struct kiri_status_info *info)
{
    int fd = -1;
    int rc = private_key ? kiri_platform_file_create_private(path, info, &fd) : kiri_platform_file_create(path, info, &fd);
    if (rc != KIRI_OK)
        return rc;
    if ((rc = kiri_platform_file_write(fd, path, text, strlen(text), info)) != KIRI_OK) {
        kiri_platform_file_abort(fd, path);
        return rc;
    }
    return kiri_platform_file_sync_close(fd, path, info);
}

static int cmd_keygen(struct opts *o, const char **args, int n_args)
{
    (void)args;
    (void)n_args;
    if (!o->out) {
        fprintf(stderr, "kiri: error: keygen needs --out DIR\n");
        return 2;
    }
    struct kiri_status_info info;
    char *priv = NULL, *pub = NULL, *priv_path = NULL, *pub_path = NULL;
    char id[KIRI_MANIFEST_KEY_ID_LEN + 1];
    size_t n = strlen(o->out) + 32;
    int rc = kiri_platform_mkdir(o->out, &info);
    if (rc == KIRI_OK)
        rc = kiri_manifest_keygen(&priv, &pub, &info);
    if (rc == KIRI_OK) {
        priv_path = kiri_mem_alloc(n);
        pub_path = kiri_mem_alloc(n);
        if (!priv_path || !pub_path)
            rc = kiri_error_set(&info, KIRI_E_NOMEM, "out of memory");
    }
    if (rc == KIRI_OK) {
        snprintf(priv_path, n, "%s/fleet-key.pem", o->out);
        snprintf(pub_path, n, "%s/fleet-pub.pem", o->out);
        /* The private key is created with O_EXCL: keygen never overwrites a key. */
        rc = write_file(priv_path, priv, 1, &info);
        if (rc == KIRI_OK && (rc = write_file(pub_path, pub, 0, &info)) != KIRI_OK)
            kiri_platform_file_remove(priv_path, NULL);
    }
    if (rc == KIRI_OK)
        rc = kiri_manifest_key_id(pub, strlen(pub), 0, id, &info);
    if (rc == KIRI_OK)
        printf("private key: %s (mode 0600: keep it offline)\npublic key:  %s (pin it on devices)\nkey id:      %s\n",
               priv_path, pub_path, id);
    if (priv)
        memset(priv, 0, strlen(priv));
    kiri_mem_free(priv);
    kiri_mem_free(pub);
    kiri_mem_free(priv_path);
    kiri_mem_free(pub_path);
    return rc == KIRI_OK ? 0 : fail("fleet keygen", &info);
}

static int cmd_sign(struct opts *o, const char **args, int n_args)
{
    if (!o->key || n_args != 1) {
        fprintf(stderr, "kiri: error: usage: kiri fleet sign --key PRIVATE.pem MANIFEST.json > SIGNED.json\n");
        return 2;
    }
    struct kiri_status_info info;
    char *key = NULL, *man = NULL, *env = NULL;
    size_t key_len = 0, man_len = 0, env_len = 0;
    int rc = kiri_platform_read_file(o->key, KEY_FILE_MAX, &key, &key_len, &info);
    if (rc == KIRI_OK)
        rc = kiri_platform_read_file(args[0], KIRI_MANIFEST_MAX_BYTES, &man, &man_len, &info);
    if (rc == KIRI_OK)
        rc = kiri_manifest_sign(key, key_len, man, man_len, &env, &env_len, &info);
    if (rc == KIRI_OK && (fwrite(env, 1, env_len, stdout) != env_len || fflush(stdout) != 0))
        rc = kiri_error_set(&info, KIRI_E_IO, "cannot write to stdout");
    if (key)
        memset(key, 0, key_len);
    kiri_mem_free(key);
    kiri_mem_free(man);
    kiri_mem_free(env);
    return rc == KIRI_OK ? 0 : fail("fleet sign", &info);
}

static void print_manifest(const struct kiri_manifest *m)
{
    char issued[21], expires[21];
    kiri_manifest_format_time(m->issued, issued);
    kiri_manifest_format_time(m->expires, expires);
    printf("version %llu, issued %s, expires %s, routing %s, signed by %s\n", (unsigned long long)m->version, issued,
           expires, m->routing, m->key_id);
    if (m->upstream_url)
        printf("upstream  %s\n", m->upstream_url);
    if (m->heartbeat_url)
        printf("heartbeat %s\n", m->heartbeat_url);
    for (int i = 0; i < m->n_models; i++)
        printf("model %s  %llu bytes  sha256 %s  %s\n", m->models[i].name, (unsigned long long)m->models[i].size,
               m->models[i].sha256_hex, m->models[i].url);
}

static int cmd_verify(struct opts *o, const char **args, int n_args)
{
    if (n_args != 1) {
        fprintf(stderr, "kiri: error: usage: kiri fleet verify --pubkey PUBLIC.pem SIGNED.json [--models-dir DIR]\n");
        return 2;
    }
    struct kiri_manifest_keys *keys = NULL;
    int rc = load_keys(o, &keys);
    if (rc)
        return rc;
    struct kiri_status_info info;
    struct kiri_manifest_policy pol;
    memset(&pol, 0, sizeof pol);
    char *env = NULL;
    size_t len = 0;
    rc = o->models_dir ? kiri_fleet_state_policy(o->models_dir, &pol, &info) : KIRI_OK;
    if (rc == KIRI_OK)
        rc = kiri_platform_read_file(args[0], KIRI_MANIFEST_MAX_ENVELOPE, &env, &len, &info);
    struct kiri_manifest *m = NULL;
    int same = 0;
    if (rc == KIRI_OK) {
        pol.now = kiri_platform_wall_time();
        pol.skew = o->fo.skew;
        pol.max_jump = o->fo.max_version_jump;
        rc = kiri_manifest_verify(keys, env, len, &pol, &m, &same, &info);
    }
    if (rc == KIRI_OK) {
        printf("ok: %s\n", same ? "the manifest the directory already holds" : "signature, expiry and version accepted");
        print_manifest(m);
    }
    kiri_manifest_free(m);
    kiri_mem_free(env);
    kiri_manifest_keys_free(keys);
    return rc == KIRI_OK ? 0 : fail("fleet verify: manifest rejected", &info);
}

/* ---------------------------------------------------------------------------------------------
 * sync
 * ------------------------------------------------------------------------------------------- */

static const char *action_name(int a)
{
    return a == KIRI_FLEET_UNCHANGED ? "unchanged" : a == KIRI_FLEET_INSTALLED ? "installed"
         : a == KIRI_FLEET_RESTORED ? "restored" : "failed";
}

static json_t *download_json(const struct kiri_download_result *d)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:f}", "attempts", d->attempts, "resumed", d->resumed,
                     "restarted", d->restarted, "hash_mismatches", d->hash_mismatches, "retries_after", d->retries_after,
                     "last_status", d->last_status, "bytes_received", (json_int_t)d->bytes_received, "bytes_reused",
                     (json_int_t)d->bytes_reused, "seconds", d->seconds);
}

static void print_json(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    if (s)
        printf("%s\n", s);
    fflush(stdout);
    kiri_mem_free(s);
    json_decref(j);
}

static int cmd_sync(struct opts *o, const char **args, int n_args)
{
    (void)args;
    (void)n_args;
    if (!o->models_dir || (!o->manifest_url == !o->manifest_file)) {
        fprintf(stderr, "kiri: error: sync needs --models-dir DIR and one of --manifest-url URL, --manifest-file FILE\n");
        return 2;
    }
    struct kiri_manifest_keys *keys = NULL;
    int rc = load_keys(o, &keys);
    if (rc)
        return rc;
    struct kiri_status_info info;
    char *env = NULL;
    size_t len = 0;
    if (o->manifest_file &&
        kiri_platform_read_file(o->manifest_file, KIRI_MANIFEST_MAX_ENVELOPE, &env, &len, &info) != KIRI_OK) {
        kiri_manifest_keys_free(keys);
        return fail(o->manifest_file, &info);
    }
    o->fo.models_dir = o->models_dir;
    o->fo.manifest_url = o->manifest_url;
    o->fo.envelope = env;
    o->fo.envelope_len = len;
    o->fo.keys = keys;
    o->fo.log = log_line;
    struct kiri_fleet_report rep;
    rc = kiri_fleet_sync(&o->fo, &rep, &info);
    if (o->json) {
        json_t *models = json_array();
        for (int i = 0; i < rep.n_models; i++) {
            const struct kiri_fleet_model_status *ms = &rep.models[i];
            json_array_append_new(models, json_pack("{s:s, s:s, s:s, s:s, s:s, s:o}", "name", ms->name, "file", ms->file,
                                                    "action", action_name(ms->action), "error_field",
                                                    ms->error ? ms->error->field : "", "error",
                                                    ms->error ? ms->error->message : "", "download",
                                                    download_json(&ms->download)));
        }
        print_json(json_pack("{s:s, s:s, s:s, s:b, s:I, s:I, s:o, s:i, s:i, s:i, s:i, s:f}", "manifest",
                             rep.manifest_status == KIRI_OK ? "accepted" : rep.manifest_rejected ? "rejected"
                                                                                  : "unavailable", "reason",
                             rep.manifest_status == KIRI_OK ? "" : rep.manifest_error->field, "message",
                             rep.manifest_status == KIRI_OK ? "" : rep.manifest_error->message, "same",
                             rep.manifest_same, "version_before", (json_int_t)rep.version_before, "version",
                             (json_int_t)rep.version, "models", models, "changed", rep.n_changed, "failed", rep.n_failed,
                             "stale_removed", rep.n_stale_removed, "hash_mismatches", rep.hash_mismatches, "seconds",
                             rep.seconds));
    } else if (rep.manifest_status == KIRI_OK) {
        printf("manifest version %llu%s\n", (unsigned long long)rep.version, rep.manifest_same ? " (unchanged)" : "");
        for (int i = 0; i < rep.n_models; i++)
            printf("%-24s %s%s%s\n", rep.models[i].name, action_name(rep.models[i].action),
                   rep.models[i].action == KIRI_FLEET_FAILED ? ": " : "",
                   rep.models[i].action == KIRI_FLEET_FAILED ? rep.models[i].error->message : "");
    }
    kiri_fleet_report_free(&rep);
    kiri_mem_free(env);
    kiri_manifest_keys_free(keys);
    return rc == KIRI_OK ? 0 : fail("fleet sync", &info);
}

/* ---------------------------------------------------------------------------------------------
 * pull
 * ------------------------------------------------------------------------------------------- */

static int stop_at_once(void *user, const struct kiri_https_response *r, const void *d, size_t n)
{
    (void)user;
    (void)r;
    (void)d;
    (void)n;
    return 1;
}

/* The size an https server declares for url (one GET, abandoned at the first body bytes). */
static int probe_size(struct kiri_https_client *c, const char *url, uint64_t *size, struct kiri_status_info *info)
{
    struct kiri_https_response *resp = kiri_mem_alloc(sizeof *resp);
    if (!resp)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    struct kiri_https_request req = {.url = url};
    int rc = kiri_https_get(c, &req, stop_at_once, NULL, resp, info);
    if (rc == KIRI_E_CANCELLED && resp->failure == KIRI_HTTPS_ABORTED)
        rc = KIRI_OK;
    if (rc == KIRI_OK && (resp->status != 200 || resp->content_length <= 0))
        rc = resp->status != 200 ? kiri_error_at(info, KIRI_E_IO, "http", -1, "HTTP %d from %.200s", resp->status, url)
                                 : kiri_error_at(info, KIRI_E_IO, "size", -1,
                                                 "the server does not declare the file's length; pass --size");
    if (rc == KIRI_OK)
        *size = (uint64_t)resp->content_length;
    kiri_mem_free(resp);
    return rc;
}

static int name_from(const char *ref, int is_url, const struct kiri_oci_ref *r, char *out, size_t cap)
{
    if (is_url) {
        const char *p = strrchr(ref, '/');
        p = p ? p + 1 : ref;
        size_t n = strcspn(p, "?#");
        if (n > 5 && strncmp(p + n - 5, ".gguf", 5) == 0)
            n -= 5;
        if (n >= cap)
            return -1;
        snprintf(out, cap, "%.*s", (int)n, p);
    } else {
        const char *p = strrchr(r->repo, '/');
        p = p ? p + 1 : r->repo;
        char tmp[sizeof r->repo + sizeof r->tag + 2];
        if (r->tag[0] && strcmp(r->tag, "latest") != 0)
            snprintf(tmp, sizeof tmp, "%s-%s", p, r->tag);
        else
            snprintf(tmp, sizeof tmp, "%s", p);
        if (strlen(tmp) >= cap)
            return -1;
        memcpy(out, tmp, strlen(tmp) + 1);
    }
    return kiri_model_name_ok(out, strlen(out)) ? 0 : -1;
}

static int cmd_pull(struct opts *o, const char **args, int n_args)
{
    if (n_args != 1 || !o->models_dir) {
        fprintf(stderr, "kiri: error: usage: kiri pull REF --models-dir DIR [--sha256 HEX] (kiri fleet --help)\n");
        return 2;
    }
    const char *ref = args[0];
    const int is_url = strncmp(ref, "https://", 8) == 0;
    struct kiri_oci_ref oref;
    uint8_t want[32];
    if (strncmp(ref, "http://", 7) == 0) {
        fprintf(stderr, "kiri: error: pull: plain http:// is refused; use https://\n");
        return 2;
    }
    if (!is_url && kiri_oci_parse_ref(ref, &oref) != 0) {
        fprintf(stderr, "kiri: error: pull: '%s' is neither an https:// URL nor an OCI reference host[:port]/repo[:tag]\n", ref);
        return 2;
    }
    if (o->sha256 && kiri_hex_decode_str(o->sha256, want, 32) != 0) {
        fprintf(stderr, "kiri: error: --sha256 needs 64 hex digits\n");
        return 2;
    }
    if (is_url && !o->sha256) {
        fprintf(stderr, "kiri: error: pull from an https:// URL needs --sha256 HEX (the hash is what is trusted)\n");
        return 2;
    }
    char name[KIRI_MANIFEST_MAX_NAME + 1], file[KIRI_MANIFEST_MAX_NAME + 6];
    if (o->name ? !kiri_model_name_ok(o->name, strlen(o->name)) : name_from(ref, is_url, &oref, name, sizeof name) != 0) {
        fprintf(stderr, "kiri: error: pull: cannot make a model name from '%s'; pass --name NAME\n", o->name ? o->name : ref);
        return 2;
    }
    if (o->name)
        snprintf(name, sizeof name, "%s", o->name);
    snprintf(file, sizeof file, "%s.gguf", name);

    struct kiri_status_info info;
    struct kiri_https_client *c = NULL;
    struct kiri_oci_blob blob;
    memset(&blob, 0, sizeof blob);
    struct kiri_download_request dr;
    memset(&dr, 0, sizeof dr);
    struct kiri_download_result res;
    memset(&res, 0, sizeof res);
    int lock = -1, rc, installed_already = 0;
    char *lock_path = kiri_mem_alloc(strlen(o->models_dir) + 32), *path = kiri_mem_alloc(strlen(o->models_dir) + 80);
    if (!lock_path || !path) {
        rc = kiri_error_set(&info, KIRI_E_NOMEM, "out of memory");
        goto out;
    }
    snprintf(lock_path, strlen(o->models_dir) + 32, "%s/%s", o->models_dir, KIRI_FLEET_LOCK_FILE);
    snprintf(path, strlen(o->models_dir) + 80, "%s/%s", o->models_dir, file);
    if ((rc = kiri_platform_mkdir(o->models_dir, &info)) != KIRI_OK ||
        (rc = kiri_platform_lock_file(lock_path, &lock, &info)) != KIRI_OK ||
        (rc = kiri_https_client_init(&o->fo.https, &c, &info)) != KIRI_OK)
        goto out;
    dr.dir = o->models_dir;
    dr.name = file;
    dr.disk_margin = o->fo.disk_margin;
    dr.max_attempts = o->fo.max_attempts;
    dr.backoff_base = o->fo.backoff_base;
    dr.backoff_max = o->fo.backoff_max;
    dr.log = log_line;
    const char *headers[2] = {NULL, NULL};
    if (is_url) {
        dr.url = ref;
        memcpy(dr.sha256, want, 32);
        dr.size = o->size;
        if (!dr.size && (rc = probe_size(c, ref, &dr.size, &info)) != KIRI_OK)
            goto out;
    } else {
        if ((rc = kiri_oci_resolve(c, &oref, &blob, log_line, NULL, &info)) != KIRI_OK)
            goto out;
        if (o->sha256 && memcmp(want, blob.sha256, 32) != 0) {
            rc = kiri_error_at(&info, KIRI_E_MODEL_INVALID, "sha256", -1,
                               "the registry's layer is %.19s..., not the --sha256 given", blob.digest);
            goto out;
        }
        if (o->size && o->size != blob.size) {
            rc = kiri_error_at(&info, KIRI_E_MODEL_INVALID, "size", -1, "the registry's layer is %llu bytes, not --size",
                               (unsigned long long)blob.size);
            goto out;
        }
        dr.url = blob.url;
        memcpy(dr.sha256, blob.sha256, 32);
        dr.size = blob.size;
        headers[0] = blob.auth_header;
        dr.headers = headers;
    }
    uint64_t have;
    uint8_t h[32];
    if (kiri_platform_file_size(path, &have, NULL) == KIRI_OK && have == dr.size &&
        kiri_download_file_sha256(path, h, NULL) == KIRI_OK && memcmp(h, dr.sha256, 32) == 0) {
        installed_already = 1;
        fprintf(stderr, "kiri: fleet: %s: already installed with this sha256\n", file);
    } else {
        rc = kiri_download_install(c, &dr, &res, &info);
    }
out:
    if (o->json) {
        char hex[65] = "";
        if (dr.size)
            kiri_hex_encode(dr.sha256, 32, hex);
        print_json(json_pack("{s:s, s:s, s:s, s:I, s:s, s:s, s:s, s:o}", "file", file, "status",
                             rc == KIRI_OK ? (installed_already ? "unchanged" : "installed") : "failed", "sha256", hex,
                             "size", (json_int_t)dr.size, "error_field", rc == KIRI_OK ? "" : info.field, "error",
                             rc == KIRI_OK ? "" : info.message, "url", dr.url ? dr.url : "", "download",
                             download_json(&res)));
    } else if (rc == KIRI_OK) {
        printf("%s\n", path);
    }
    kiri_oci_blob_free(&blob);
    kiri_https_client_free(c);
    kiri_platform_lock_release(lock);
    kiri_mem_free(lock_path);
    kiri_mem_free(path);
    return rc == KIRI_OK ? 0 : fail("pull", &info);
}

/* ---------------------------------------------------------------------------------------------
 * Entry points
 * ------------------------------------------------------------------------------------------- */

int kiri_fleet_cli_pull(int argc, char **argv)
{
    return run_verb(&verbs[N_VERBS - 1], argc, argv, 2);
}

int kiri_fleet_cli_fleet(int argc, char **argv)
{
    if (argc < 3 || !strcmp(argv[2], "-h") || !strcmp(argv[2], "--help")) {
        fleet_usage(argc < 3 ? stderr : stdout);
        return argc < 3 ? 2 : 0;
    }
    for (size_t i = 0; i < N_VERBS; i++)
        if (!strncmp(verbs[i].name, "fleet ", 6) && !strcmp(verbs[i].name + 6, argv[2]))
            return run_verb(&verbs[i], argc, argv, 3);
    fprintf(stderr, "kiri: error: unknown fleet command '%s' (kiri fleet --help)\n", argv[2]);
    return 2;
}
