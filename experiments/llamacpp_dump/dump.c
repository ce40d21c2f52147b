/* A tensor dumper that drives the llama.cpp inside PyPI's xllamacpp wheel (its .so exports
 * llama.cpp's and ggml's C API), so every dumped value comes from the very binary the parity
 * tests use as their oracle. Research tool only: built by build.sh, loaded by dump.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

static char g_dir[4096];
static int g_seq;          /* node counter within one eval */
static const char *g_want; /* NULL: no dump; "*": every node; else comma list of name prefixes */

static int wanted(const char *name) {
    if (!g_want) return 0;
    if (g_want[0] == '*') return 1;
    const char *p = g_want;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n && strncmp(name, p, n) == 0 && (name[n] == 0 || name[n] == ' ')) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

static bool cb(struct ggml_tensor *t, bool ask, void *ud) {
    (void)ud;
    if (ask) return wanted(t->name);
    size_t nb = ggml_nbytes(t);
    void *buf = malloc(nb);
    ggml_backend_tensor_get(t, buf, 0, nb);
    char path[4400];
    char nm[128];
    snprintf(nm, sizeof nm, "%s", t->name);
    for (char *c = nm; *c; c++) if (*c == '/' || *c == ' ') *c = '_';
    snprintf(path, sizeof path, "%s/%04d_%s.bin", g_dir, g_seq++, nm);
    FILE *f = fopen(path, "wb");
    if (f) {
        int64_t hdr[10] = {t->type, t->op, t->ne[0], t->ne[1], t->ne[2], t->ne[3],
                           (int64_t)t->nb[0], (int64_t)t->nb[1], (int64_t)t->nb[2], (int64_t)t->nb[3]};
        fwrite(hdr, sizeof hdr, 1, f);
        fwrite(buf, 1, nb, f);
        fclose(f);
    }
    free(buf);
    return true;
}

static void quiet(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    if (level >= GGML_LOG_LEVEL_WARN || getenv("DUMP_VERBOSE")) fputs(text, stderr);
}

struct dumper { struct llama_model *model; struct llama_context *ctx; int pos; int n_vocab; };

/* the server's settings in tests/peer.py: n_ctx 4096, n_batch = n_ubatch = 512, 1 sequence,
 * f16 KV cache, flash attention auto, a SWA cache of the window's size (the server's
 * default swa_full = false), threads as given */
void *dump_open(const char *path, int n_ctx, int n_threads, int flash, int swa_full) {
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    if (getenv("DUMP_NO_REPACK")) mp.use_extra_bufts = false;
    struct llama_model *m = llama_model_load_from_file(path, mp);
    if (!m) return NULL;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = n_threads;
    if (flash >= -1) cp.flash_attn_type = flash;
    cp.swa_full = swa_full != 0;
    cp.cb_eval = cb;
    cp.cb_eval_user_data = NULL;
    struct llama_context *c = llama_init_from_model(m, cp);
    if (!c) return NULL;
    struct dumper *d = calloc(1, sizeof *d);
    d->model = m;
    d->ctx = c;
    d->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
    return d;
}

int dump_n_vocab(void *h) { return ((struct dumper *)h)->n_vocab; }

void dump_reset(void *h) {
    struct dumper *d = h;
    llama_memory_clear(llama_get_memory(d->ctx), true);
    d->pos = 0;
}

/* decode n tokens at the next positions; logits for the last one (all_logits: for each) are
 * copied to out; tensors whose names match `want` are written under dir */
int dump_eval(void *h, const int *tokens, int n, int all_logits, const char *want, const char *dir,
              float *out) {
    struct dumper *d = h;
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = tokens[i];
        b.pos[i] = d->pos + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = all_logits || i == n - 1;
    }
    b.n_tokens = n;
    g_want = (want && want[0]) ? want : NULL;
    snprintf(g_dir, sizeof g_dir, "%s", dir ? dir : ".");
    g_seq = 0;
    int rc = llama_decode(d->ctx, b);
    g_want = NULL;
    if (rc == 0) {
        d->pos += n;
        int k = 0;
        for (int i = 0; i < n; i++)
            if (b.logits[i]) memcpy(out + (size_t)(k++) * d->n_vocab, llama_get_logits_ith(d->ctx, i),
                                    sizeof(float) * d->n_vocab);
    }
    llama_batch_free(b);
    return rc;
}
