/* Hugging Face config.json + safetensors checkpoint -> fp32 weights. */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine_internal.h"

#define OE_MAX_SHARDS 256

static int json_get_int(json_t *root, const char *key, int *out)
{
    json_t *v = json_object_get(root, key);
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > (1 << 30)) return 0;
    *out = (int)json_integer_value(v);
    return 1;
}

/* A JSON value's type, for messages about a key that holds the wrong one. */
static const char *json_kind(json_t *v)
{
    return json_is_string(v) ? "a string" : json_is_object(v) ? "an object" : json_is_array(v) ? "an array"
           : json_is_boolean(v) ? "a boolean" : json_is_real(v) ? "a real number" : "a number";
}

/* Optional keys: absent or null leaves *out (the default). Present with another type or an
 * out-of-range value is refused naming the key: a value the loader cannot read was silently
 * replaced by the default before ("rope_theta": "1000000.0" ran with 10000: finite, wrong
 * logits without a word). */
static oscar_status opt_int(const char *path, json_t *obj, const char *key, int *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return OSCAR_OK;
    if (json_is_integer(v) && !json_get_int(obj, key, out))
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: %s is %lld, outside [1, 2^30]; give the model's value or "
                            "remove the key (null) for the default", path, key, (long long)json_integer_value(v));
    if (!json_is_integer(v))
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: %s is %s, not an integer; write it as a positive JSON "
                            "integer (no quotes) or remove it (null) for the default", path, key, json_kind(v));
    return OSCAR_OK;
}

static oscar_status opt_num(const char *path, json_t *obj, const char *where, const char *key, double *out,
                            int *given)
{
    json_t *v = json_object_get(obj, key);
    if (given) *given = 0;
    if (!v || json_is_null(v)) return OSCAR_OK;
    if (!json_is_number(v) || !(json_number_value(v) > 0.0) || !isfinite(json_number_value(v)))
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: %s%s is %s%s, not a positive finite number; write the "
                            "model's value as a JSON number (no quotes) or remove the key (null) for the default",
                            path, where, key, json_kind(v), json_is_number(v) ? " <= 0" : "");
    *out = json_number_value(v);
    if (given) *given = 1;
    return OSCAR_OK;
}

static oscar_status opt_bool(const char *path, json_t *obj, const char *key, int *out)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return OSCAR_OK;
    if (!json_is_boolean(v))
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: %s is %s, not a boolean; write true or false (no quotes)",
                            path, key, json_kind(v));
    *out = json_is_true(v);
    return OSCAR_OK;
}

/* partial_rotary_factor below 1 rotates only part of each head (transformers reads it at the top
 * level or in rope_parameters); the engine rotates all of it: refused, not computed otherwise. */
static oscar_status check_partial_rotary(const char *path, json_t *obj, const char *where)
{
    double f = 1.0;
    oscar_status s = opt_num(path, obj, where, "partial_rotary_factor", &f, NULL);
    if (s == OSCAR_OK && f != 1.0)
        s = oe_set_error(OSCAR_ERR_UNSUPPORTED, "%s: %spartial_rotary_factor %g (RoPE on part of each head) is not "
                         "supported by the reference engine, which rotates the whole head; only 1 is", path, where, f);
    return s;
}

/* The RoPE scaling of a rope_scaling / rope_parameters object into *r, *typed = 1 when it names a
 * type (absent or null: nothing). transformers' default, linear, llama3 and yarn are computed
 * (oe_rope_inv_freq); another type changes positions in a way the engine does not compute:
 * refused rather than run as something else. max_position: the config's max_position_embeddings,
 * transformers' fallback for original_max_position_embeddings (0: none). */
static oscar_status parse_rope(const char *path, json_t *obj, const char *what, int max_position, oe_rope *r,
                               int *typed)
{
    *typed = 0;
    if (!obj || json_is_null(obj)) return OSCAR_OK;
    if (!json_is_object(obj))
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: '%s' is not an object", path, what);
    json_t *t = json_object_get(obj, "rope_type");
    if (!t || json_is_null(t)) t = json_object_get(obj, "type");
    if (!t || json_is_null(t)) return OSCAR_OK;
    if (!json_is_string(t))
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: %s.rope_type is %s, not a string", path, what, json_kind(t));
    const char *name = json_string_value(t);
    oe_rope x = {.type = OE_ROPE_DEFAULT, .beta_fast = 32.0, .beta_slow = 1.0, .truncate = 1};
    if (!strcmp(name, "linear")) x.type = OE_ROPE_LINEAR;
    else if (!strcmp(name, "llama3")) x.type = OE_ROPE_LLAMA3;
    else if (!strcmp(name, "yarn")) x.type = OE_ROPE_YARN;
    else if (strcmp(name, "default"))
        return oe_set_error(OSCAR_ERR_UNSUPPORTED, "%s: %s.rope_type '%s' (RoPE scaling) is not supported by the "
                            "reference engine; it computes default, linear, llama3 and yarn", path, what, name);
    char where[48];
    snprintf(where, sizeof where, "%s.", what);
    oscar_status s = OSCAR_OK;
    int has_factor = 0;
    if (x.type != OE_ROPE_DEFAULT) {
        if ((s = opt_num(path, obj, where, "factor", &x.factor, &has_factor)) != OSCAR_OK) return s;
        if ((s = opt_int(path, obj, "original_max_position_embeddings", &x.original_max_position)) != OSCAR_OK)
            return s;
        if (!x.original_max_position) x.original_max_position = max_position;
        if (!x.original_max_position && x.type != OE_ROPE_LINEAR)
            return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: %s (rope_type %s) has no original_max_position_embeddings "
                                "and the config no max_position_embeddings; give the pretraining context", path,
                                what, name);
    }
    if (x.type == OE_ROPE_YARN && !has_factor && max_position > 0) { /* transformers: the two contexts' ratio */
        x.factor = (double)max_position / (double)x.original_max_position;
        has_factor = 1;
    }
    if (x.type != OE_ROPE_DEFAULT && !has_factor)
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: %s (rope_type %s) needs a factor", path, what, name);
    if (x.type == OE_ROPE_LLAMA3) {
        int lo = 0, hi = 0;
        if ((s = opt_num(path, obj, where, "low_freq_factor", &x.low_freq_factor, &lo)) != OSCAR_OK ||
            (s = opt_num(path, obj, where, "high_freq_factor", &x.high_freq_factor, &hi)) != OSCAR_OK)
            return s;
        if (!lo || !hi || x.low_freq_factor == x.high_freq_factor)
            return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: %s (rope_type llama3) needs low_freq_factor and "
                                "high_freq_factor, different from each other (got %g and %g)", path, what,
                                x.low_freq_factor, x.high_freq_factor);
    }
    if (x.type == OE_ROPE_YARN &&
        ((s = opt_num(path, obj, where, "beta_fast", &x.beta_fast, NULL)) != OSCAR_OK ||
         (s = opt_num(path, obj, where, "beta_slow", &x.beta_slow, NULL)) != OSCAR_OK ||
         (s = opt_num(path, obj, where, "attention_factor", &x.attention_factor, NULL)) != OSCAR_OK ||
         (s = opt_num(path, obj, where, "mscale", &x.mscale, NULL)) != OSCAR_OK ||
         (s = opt_num(path, obj, where, "mscale_all_dim", &x.mscale_all_dim, NULL)) != OSCAR_OK ||
         (s = opt_bool(path, obj, "truncate", &x.truncate)) != OSCAR_OK))
        return s;
    *r = x;
    *typed = 1;
    return OSCAR_OK;
}

/* YaRN's attention scaling for a context scale (transformers' get_mscale). */
static double yarn_mscale(double scale, double m)
{
    return scale <= 1.0 ? 1.0 : 0.1 * m * log(scale) + 1.0;
}

/* transformers' modeling_rope_utils (5.x), in its fp32 arithmetic where it has one. */
void oe_rope_inv_freq(const oe_config *c, float *inv, float *attention_factor)
{
    const double two_pi = 6.283185307179586;
    const int d = c->head_dim, h2 = d / 2;
    const oe_rope *r = &c->rope;
    const float factor = (float)r->factor;
    *attention_factor = 1.0f;
    for (int i = 0; i < h2; i++) inv[i] = (float)(1.0 / pow(c->rope_theta, (double)(2 * i) / (double)d));
    if (r->type == OE_ROPE_LINEAR) {
        for (int i = 0; i < h2; i++) inv[i] /= factor;
    } else if (r->type == OE_ROPE_LLAMA3) {
        /* wavelengths shorter than old_ctx / high_freq_factor kept, longer than old_ctx / low_freq_factor
         * divided by factor, those between blended */
        const float old_ctx = (float)r->original_max_position, lo = (float)r->low_freq_factor,
                    hi = (float)r->high_freq_factor;
        const float low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
        for (int i = 0; i < h2; i++) {
            const float wavelen = (float)two_pi / inv[i];
            const float scaled = wavelen > low_wavelen ? inv[i] / factor : inv[i];
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                const float smooth = (old_ctx / wavelen - lo) / (hi - lo);
                inv[i] = (1.0f - smooth) * scaled / factor + smooth * scaled;
            } else {
                inv[i] = scaled;
            }
        }
    } else if (r->type == OE_ROPE_YARN) {
        const double base = c->rope_theta, f = r->factor, orig = (double)r->original_max_position;
        double af = r->attention_factor;
        if (!(af > 0.0))
            af = r->mscale > 0.0 && r->mscale_all_dim > 0.0
                     ? yarn_mscale(f, r->mscale) / yarn_mscale(f, r->mscale_all_dim)
                     : yarn_mscale(f, 1.0);
        *attention_factor = (float)af;
        /* the dimensions whose wavelength makes beta_fast .. beta_slow turns over the pretraining context
         * ramp from extrapolated (unscaled) to interpolated (divided by factor) frequencies */
        double low = d * log(orig / (r->beta_fast * two_pi)) / (2.0 * log(base));
        double high = d * log(orig / (r->beta_slow * two_pi)) / (2.0 * log(base));
        if (r->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0.0) low = 0.0;
        if (high > d - 1) high = d - 1;
        const float flo = (float)low;
        float fhi = (float)high;
        if (flo == fhi) fhi += 0.001f;
        for (int i = 0; i < h2; i++) {
            const float pos_freq = (float)pow(base, (double)(2 * i) / (double)d);
            const float extrap = 1.0f / pos_freq, interp = 1.0f / (factor * pos_freq);
            float ramp = ((float)i - flo) / (fhi - flo);
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            const float keep = 1.0f - ramp; /* inv_freq_extrapolation_factor */
            inv[i] = interp * (1.0f - keep) + extrap * keep;
        }
    }
}

/* Whether two parsed RoPE scalings compute the same frequencies (the fields their type reads). */
static int rope_same(const oe_rope *a, const oe_rope *b)
{
    if (a->type != b->type) return 0;
    if (a->type == OE_ROPE_DEFAULT) return 1;
    if (a->factor != b->factor || a->original_max_position != b->original_max_position) return 0;
    if (a->type == OE_ROPE_LLAMA3)
        return a->low_freq_factor == b->low_freq_factor && a->high_freq_factor == b->high_freq_factor;
    if (a->type == OE_ROPE_YARN)
        return a->beta_fast == b->beta_fast && a->beta_slow == b->beta_slow &&
               a->attention_factor == b->attention_factor && a->mscale == b->mscale &&
               a->mscale_all_dim == b->mscale_all_dim && a->truncate == b->truncate;
    return 1;
}

oscar_status oe_config_load(const char *path, oe_config *c)
{
    if (!path || !c) return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_config_load: NULL argument");
    memset(c, 0, sizeof *c);
    oscar_status rs = oe_check_regular(path, "model config");
    if (rs != OSCAR_OK) return rs;
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return oe_set_error(OSCAR_ERR_IO, "%s: cannot read config (%s, line %d)", path, jerr.text, jerr.line);
    oscar_status s = OSCAR_OK;
    if (!json_is_object(root)) {
        s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: not a JSON object", path);
        goto done;
    }
    json_t *mt = json_object_get(root, "model_type");
    const char *type = json_is_string(mt) ? json_string_value(mt) : "(missing)";
    /* Mistral is the Llama layout with an optional attention span. */
    if (!strcmp(type, "llama") || !strcmp(type, "mistral")) c->arch = OE_ARCH_LLAMA;
    else if (!strcmp(type, "qwen2")) c->arch = OE_ARCH_QWEN2;
    else if (!strcmp(type, "qwen3")) c->arch = OE_ARCH_QWEN3;
    else {
        s = oe_set_error(OSCAR_ERR_UNSUPPORTED, "%s: model_type '%s' is not supported; the reference engine "
                         "runs 'llama', 'mistral', 'qwen2' and 'qwen3' checkpoints (other architectures calibrate with "
                         "python -m liboscar.hf)", path, type);
        goto done;
    }
    snprintf(c->model_type, sizeof c->model_type, "%s", type);
    const char *keys[5] = {"num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                           "vocab_size"};
    int *dst[5] = {&c->num_layers, &c->hidden, &c->num_q_heads, &c->intermediate, &c->vocab};
    int bad_key = -1;
    for (int i = 0; i < 5 && bad_key < 0; i++)
        if (!json_get_int(root, keys[i], dst[i])) bad_key = i;
    if (bad_key >= 0) { /* name the key and what it holds: a value past 2^30 was called "not positive" */
        json_t *v = json_object_get(root, keys[bad_key]);
        char got[64];
        if (json_is_integer(v))
            snprintf(got, sizeof got, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        else
            snprintf(got, sizeof got, "%s", v ? json_kind(v) : "missing");
        s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: %s is %s; it must be an integer in [1, 2^30] (num_hidden_layers, "
                         "hidden_size, num_attention_heads, intermediate_size and vocab_size are required)", path,
                         keys[bad_key], got);
        goto done;
    }
    /* no num_key_value_heads key: the config classes' defaults, MistralConfig's 8, Qwen2Config's and
     * Qwen3Config's 32 (LlamaConfig's, and null for any: num_attention_heads, multi-head attention) */
    const int kv_default = json_object_get(root, "num_key_value_heads") ? 0
                           : c->arch == OE_ARCH_QWEN2 || c->arch == OE_ARCH_QWEN3 ? 32
                           : !strcmp(type, "mistral") ? 8 : 0;
    c->num_kv_heads = kv_default ? kv_default : c->num_q_heads;
    if ((s = opt_int(path, root, "num_key_value_heads", &c->num_kv_heads)) != OSCAR_OK ||
        (s = opt_int(path, root, "head_dim", &c->head_dim)) != OSCAR_OK ||
        (s = opt_int(path, root, "max_position_embeddings", &c->max_position)) != OSCAR_OK)
        goto done;
    /* no head_dim key: Qwen3Config's 128 (null: hidden / heads, as the others' default) */
    if (!c->head_dim && c->arch == OE_ARCH_QWEN3 && !json_object_get(root, "head_dim")) c->head_dim = 128;
    if (!c->head_dim) {
        if (c->hidden % c->num_q_heads) {
            s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: no head_dim and hidden_size %d is not a multiple of "
                             "num_attention_heads %d", path, c->hidden, c->num_q_heads);
            goto done;
        }
        c->head_dim = c->hidden / c->num_q_heads;
    }
    if (kv_default && c->num_q_heads % c->num_kv_heads) {
        s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: no num_key_value_heads, whose default for model_type '%s' is "
                         "%d (transformers' config class), and num_attention_heads %d is not a multiple of it; give "
                         "the model's num_key_value_heads", path, type, kv_default, c->num_q_heads);
        goto done;
    }
    if (c->num_q_heads % c->num_kv_heads || c->head_dim % 2) {
        s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: num_attention_heads %d must be a multiple of "
                         "num_key_value_heads %d and head_dim %d even", path, c->num_q_heads, c->num_kv_heads,
                         c->head_dim);
        goto done;
    }
    /* rms_norm_eps is added to the mean square under the root of every RMSNorm: checkpoints use 1e-5
     * or 1e-6; 5 or 1e-300 loaded and ran (and the GPU engine's float32 copy of 1e-300 is 0, under
     * which an all-zero row divides by zero). Outside [1e-12, 0.1] the config is refused. */
    const double eps_lo = 1e-12, eps_hi = 0.1;
    json_t *eps = json_object_get(root, "rms_norm_eps");
    if (json_is_number(eps) && !(json_number_value(eps) >= eps_lo && json_number_value(eps) <= eps_hi)) {
        const double e = json_number_value(eps);
        char shown[32];
        for (int p = 1; p <= 17; p++) { /* the shortest form that reads back as the value: 0.10000001, not 0.1 */
            snprintf(shown, sizeof shown, "%.*g", p, e);
            if (strtod(shown, NULL) == e) break;
        }
        s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: rms_norm_eps is %s, outside [%g, %g] (checkpoints use 1e-5 or "
                         "1e-6); write the model's value, or remove the key (null) for the default 1e-6", path, shown,
                         eps_lo, eps_hi);
        goto done;
    }
    c->rms_eps = 1e-6;
    if ((s = opt_num(path, root, "", "rms_norm_eps", &c->rms_eps, NULL)) != OSCAR_OK) goto done;
    json_t *act = json_object_get(root, "hidden_act");
    if (act && !(json_is_string(act) && !strcmp(json_string_value(act), "silu"))) {
        s = oe_set_error(OSCAR_ERR_UNSUPPORTED, "%s: hidden_act '%s' is not supported (SwiGLU with silu only)",
                         path, json_is_string(act) ? json_string_value(act) : "?");
        goto done;
    }
    /* RoPE: rope_parameters (transformers 5), or rope_scaling and a top-level rope_theta (4.x). transformers 5
     * reads rope_scaling as rope_parameters' old name: a non-empty one replaces rope_parameters whole, its
     * rope_theta included (else the top level's, else 10000). */
    json_t *rp = json_object_get(root, "rope_parameters"), *rsc = json_object_get(root, "rope_scaling");
    const int rs_given = json_is_object(rsc) && json_object_size(rsc) > 0,
              rp_given = json_is_object(rp) && json_object_size(rp) > 0;
    oe_rope r_scaling, r_params;
    int typed_scaling = 0, typed_params = 0;
    if ((s = parse_rope(path, rsc, "rope_scaling", c->max_position, &r_scaling, &typed_scaling)) != OSCAR_OK ||
        (s = parse_rope(path, rp, "rope_parameters", c->max_position, &r_params, &typed_params)) != OSCAR_OK)
        goto done;
    if (!typed_scaling) r_scaling = (oe_rope){.type = OE_ROPE_DEFAULT};
    if (!typed_params) r_params = (oe_rope){.type = OE_ROPE_DEFAULT};
    if (rs_given && rp_given && r_scaling.type != r_params.type) {
        s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: rope_scaling and rope_parameters name different rope types; "
                         "remove the wrong one", path);
        goto done;
    }
    /* Both given: transformers takes rope_parameters' and the engine took the top level's; a
     * contradiction is refused rather than either one run. */
    double top = 0.0, inner = 0.0, scal = 0.0;
    int has_top = 0, has_inner = 0, has_scal = 0;
    if ((s = opt_num(path, root, "", "rope_theta", &top, &has_top)) != OSCAR_OK ||
        (s = check_partial_rotary(path, root, "")) != OSCAR_OK)
        goto done;
    json_t *objs[2] = {rp, rsc};
    const char *names[2] = {"rope_parameters", "rope_scaling"};
    double *thetas[2] = {&inner, &scal};
    int *has[2] = {&has_inner, &has_scal};
    for (int o = 0; o < 2; o++) {
        if (!json_is_object(objs[o])) continue;
        const char *k;
        json_t *e;
        json_object_foreach(objs[o], k, e)
        {
            if (json_is_object(e)) { /* {"full_attention": {...}, ...}: RoPE per layer type */
                s = oe_set_error(OSCAR_ERR_UNSUPPORTED, "%s: %s.%s is an object (RoPE parameters per layer type), "
                                 "which the reference engine does not read; give one flat %s object", path, names[o],
                                 k, names[o]);
                goto done;
            }
        }
        char where[32];
        snprintf(where, sizeof where, "%s.", names[o]);
        if ((s = opt_num(path, objs[o], where, "rope_theta", thetas[o], has[o])) != OSCAR_OK ||
            (s = check_partial_rotary(path, objs[o], where)) != OSCAR_OK)
            goto done;
    }
    for (int o = 0; o < 2; o++)
        if (has_top && *has[o] && top != *thetas[o]) {
            s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: rope_theta %.17g and %s.rope_theta %.17g disagree "
                             "(transformers 5 uses %s'); remove the wrong one", path, top, names[o], *thetas[o],
                             names[o]);
            goto done;
        }
    const double theta_p = has_inner ? inner : has_top ? top : 10000.0, /* the transformers default */
                 theta_s = has_scal ? scal : has_top ? top : 10000.0;
    /* Both objects: transformers 5 runs rope_scaling's (4.x never read rope_parameters); which one the
     * config means is unknowable when they differ (one added by hand beside the other): refused. */
    if (rs_given && rp_given && (!rope_same(&r_scaling, &r_params) || theta_s != theta_p)) {
        s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: rope_scaling and rope_parameters disagree (%s); transformers 5 "
                         "runs rope_scaling's, older versions only know rope_scaling and a top-level rope_theta: "
                         "keep one of the two objects", path,
                         theta_s != theta_p ? "rope_theta" : "scaling parameters");
        goto done;
    }
    c->rope = rs_given ? r_scaling : r_params;
    c->rope_theta = rs_given ? theta_s : theta_p;
    json_t *span = json_object_get(root, "sliding_window");
    if (!strcmp(type, "mistral") && !span) c->sliding_window = 4096; /* absent: MistralConfig's default */
    if (!strcmp(type, "mistral") && span && !json_is_null(span) &&
        !json_get_int(root, "sliding_window", &c->sliding_window)) {
        s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: sliding_window must be null or a positive integer", path);
        goto done;
    }
    int use_sw = 0, mlp_bias = 0, attn_bias = 0;
    if ((s = opt_bool(path, root, "use_sliding_window", &use_sw)) != OSCAR_OK ||
        (s = opt_bool(path, root, "mlp_bias", &mlp_bias)) != OSCAR_OK ||
        (s = opt_bool(path, root, "attention_bias", &attn_bias)) != OSCAR_OK)
        goto done;
    if (use_sw) {
        s = oe_set_error(OSCAR_ERR_UNSUPPORTED, "%s: use_sliding_window=true is not supported; the engine "
                         "runs full causal attention", path);
        goto done;
    }
    json_t *lt = json_object_get(root, "layer_types");
    if (json_is_array(lt)) {
        size_t i;
        json_t *e;
        json_array_foreach(lt, i, e)
        {
            if (!json_is_string(e) || strcmp(json_string_value(e), "full_attention")) {
                s = oe_set_error(OSCAR_ERR_UNSUPPORTED, "%s: layer_types[%zu] is not 'full_attention'; "
                                 "only full causal attention is supported", path, i);
                goto done;
            }
        }
    }
    if (mlp_bias) {
        s = oe_set_error(OSCAR_ERR_UNSUPPORTED, "%s: mlp_bias=true is not supported", path);
        goto done;
    }
    /* GPTQ, AWQ, FP8, bitsandbytes: no plain weights to read (was refused later as missing or oddly typed
     * tensors, naming neither the quantization nor the fix) */
    json_t *quant = json_object_get(root, "quantization_config");
    if (quant && !json_is_null(quant)) {
        json_t *qm = json_is_object(quant) ? json_object_get(quant, "quant_method") : NULL;
        s = oe_set_error(OSCAR_ERR_UNSUPPORTED, "%s: quantization_config (quant_method '%s'): a quantized checkpoint "
                         "is not supported by the reference engine, which reads F32, F16 or BF16 weights; use the "
                         "model's unquantized checkpoint", path, json_is_string(qm) ? json_string_value(qm) : "?");
        goto done;
    }
    /* Absent or null: untied, the default of LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config (4.x
     * and 5.x); read as tied, a checkpoint with its own lm_head.weight was refused, one without ran. */
    c->tie_word_embeddings = 0;
    if ((s = opt_bool(path, root, "tie_word_embeddings", &c->tie_word_embeddings)) != OSCAR_OK) goto done;
    c->qk_norm = c->arch == OE_ARCH_QWEN3;
    c->no_biases = !strcmp(type, "mistral");
    c->qkv_bias = c->arch == OE_ARCH_QWEN2 ? 1 : c->no_biases ? 0 : attn_bias;
done:
    json_decref(root);
    return s;
}

/* ------------------------------------------------------------- weights */
typedef struct shard_set {
    oe_safetensors *st[OE_MAX_SHARDS];
    int n;
} shard_set;

/* The tensor `name` of the one shard holding it; *dup = 1 when another shard
 * holds it too (which copy the index meant is unknowable: refused, not the
 * first shard's taken). */
static const oe_tensor *find_any(const shard_set *ss, const char *name, int *dup)
{
    const oe_tensor *found = NULL;
    *dup = 0;
    for (int i = 0; i < ss->n; i++) {
        const oe_tensor *t = oe_st_find(ss->st[i], name);
        if (t && found) *dup = 1;
        if (t && !found) found = t;
    }
    return found;
}

/* The tensor `name`, checked to have shape [d0] or [d0][d1] (d1 = 0 for
 * 1-D) and a float dtype. optional: absent -> *out = NULL, OK. */
static oscar_status find_tensor(const shard_set *ss, const char *name, int64_t d0, int64_t d1, int optional,
                                const oe_tensor **out)
{
    *out = NULL;
    int dup;
    const oe_tensor *t = find_any(ss, name, &dup);
    if (dup)
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "checkpoint holds tensor '%s' in two shards; the checkpoint is "
                            "inconsistent (keep the copy its index names, remove the other)", name);
    if (!t) {
        if (optional) return OSCAR_OK;
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "checkpoint lacks tensor '%s'; the weights do not match "
                            "config.json", name);
    }
    int ok = d1 ? (t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1) : (t->ndim == 1 && t->shape[0] == d0);
    if (!ok) { /* both shapes in full: a 1-D weight was shown as "[512...]" against "[1073741824, 0]" */
        char has[160] = "[", want[64];
        for (int i = 0; i < t->ndim; i++) {
            size_t at = strlen(has);
            snprintf(has + at, sizeof has - at, "%s%" PRId64, i ? ", " : "", t->shape[i]);
        }
        size_t at = strlen(has);
        snprintf(has + at, sizeof has - at, "]");
        if (d1)
            snprintf(want, sizeof want, "[%" PRId64 ", %" PRId64 "]", d0, d1);
        else
            snprintf(want, sizeof want, "[%" PRId64 "]", d0);
        return oe_set_error(OSCAR_ERR_SHAPE_MISMATCH, "tensor '%s' has shape %s but config.json implies %s; the "
                            "weights and config.json are of different models", name, has, want);
    }
    if (t->dtype != OE_F32 && t->dtype != OE_F16 && t->dtype != OE_BF16)
        return oe_set_error(OSCAR_ERR_UNSUPPORTED, "tensor '%s' has dtype %s; weights must be F32, F16 or BF16",
                            name, oe_dtype_name(t->dtype));
    *out = t;
    return OSCAR_OK;
}

/* Loads tensor `name` (find_tensor's checks) into a fresh fp32 array.
 * optional: absent -> *out = NULL, OK. */
static oscar_status load_tensor(const shard_set *ss, const char *name, int64_t d0, int64_t d1, int optional,
                                float **out)
{
    *out = NULL;
    const oe_tensor *t;
    oscar_status fs = find_tensor(ss, name, d0, d1, optional, &t);
    if (fs != OSCAR_OK || !t) return fs;
    float *p = malloc((size_t)t->numel * sizeof *p);
    if (!p) return oe_set_error(OSCAR_ERR_OUT_OF_MEMORY, "out of memory loading '%s'", name);
    oscar_status s = oe_tensor_to_f32(t, p, t->numel);
    if (s != OSCAR_OK) {
        free(p);
        return s;
    }
    /* A NaN/Inf weight is refused here, naming it: in the forward the softmax's clamped exp turned
     * NaN scores into zero weights, so a NaN key weight gave a finite, wrong perplexity (exit 0). */
    for (int64_t i = 0; i < t->numel; i++)
        if (!isfinite(p[i])) {
            const float bad = p[i];
            char at[64];
            if (d1) snprintf(at, sizeof at, "row %" PRId64 ", column %" PRId64, i / d1, i % d1);
            else snprintf(at, sizeof at, "element %" PRId64, i);
            free(p);
            return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "tensor '%s' holds %s at %s: the checkpoint is corrupt (a "
                                "weight must be finite); re-download or re-export it", name,
                                isnan(bad) ? "NaN" : "an infinity", at);
        }
    *out = p;
    return OSCAR_OK;
}

/* tie_word_embeddings true: the output layer IS the input embedding. A checkpoint holding an
 * lm_head.weight as well is accepted when it has the embedding's values (torch exports keep both
 * names for one storage); one with other values contradicts config.json (transformers then warns
 * and does not tie them, running lm_head.weight): refused rather than silently ignored. Compared
 * in chunks through the conversion the embedding went through: no second vocab x hidden copy. */
static oscar_status check_tied_head(const shard_set *ss, const char *dir, const oe_config *c, const float *embed)
{
    const oe_tensor *t;
    oscar_status s = find_tensor(ss, "lm_head.weight", c->vocab, c->hidden, 1, &t);
    if (s != OSCAR_OK || !t) return s;
    enum { CHUNK = 4096 };
    float buf[CHUNK];
    const size_t es = oe_dtype_size(t->dtype);
    for (int64_t i = 0; i < t->numel; i += CHUNK) {
        const int64_t n = t->numel - i < CHUNK ? t->numel - i : CHUNK;
        oe_tensor part = *t;
        part.data = (const unsigned char *)t->data + (size_t)i * es;
        part.numel = n;
        part.nbytes = (size_t)n * es;
        if ((s = oe_tensor_to_f32(&part, buf, n)) != OSCAR_OK) return s;
        for (int64_t j = 0; j < n; j++) {
            const float a = buf[j], b = embed[i + j];
            if (a == b || !memcmp(&a, &b, sizeof a)) continue; /* equal values, or the same bits (a NaN) */
            return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s/config.json has tie_word_embeddings true (the output "
                                "layer is model.embed_tokens.weight) but the checkpoint also holds an lm_head.weight "
                                "with other values (row %" PRId64 ", column %" PRId64 ": %g, the embedding %g); "
                                "set tie_word_embeddings to false if lm_head.weight is the output layer, or remove "
                                "lm_head.weight from the checkpoint", dir, (i + j) / c->hidden, (i + j) % c->hidden,
                                (double)a, (double)b);
        }
    }
    return OSCAR_OK;
}

/* A checkpoint with layers past config.json's num_hidden_layers is another
 * model: running the first layers only gave finite, wrong logits without a word. */
static oscar_status check_no_extra_layers(const shard_set *ss, int num_layers)
{
    static const char prefix[] = "model.layers.";
    for (int i = 0; i < ss->n; i++)
        for (int j = 0; j < oe_st_count(ss->st[i]); j++) {
            const char *name = oe_st_at(ss->st[i], j)->name;
            if (strncmp(name, prefix, sizeof prefix - 1)) continue;
            char *end;
            long L = strtol(name + sizeof prefix - 1, &end, 10);
            if (end != name + sizeof prefix - 1 && *end == '.' && L >= num_layers)
                return oe_set_error(OSCAR_ERR_SHAPE_MISMATCH, "checkpoint holds tensor '%s' but config.json has "
                                    "num_hidden_layers %d: the weights and the config disagree (running %d layers "
                                    "would be another model); fix num_hidden_layers", name, num_layers, num_layers);
        }
    return OSCAR_OK;
}

/* A bias of layer L that the checkpoint holds but config.json does not give the model: transformers
 * builds those projections without a bias and leaves the tensor unused, and the engine added a
 * q/k/v or o_proj bias it found (and never read MLP biases), running another model without a word.
 * Attention biases: q/k/v with attention_bias (always for Qwen2), o_proj with attention_bias
 * (never for Qwen2); none for Mistral, whatever attention_bias says; MLP biases never (mlp_bias true
 * is refused with the config). */
static oscar_status check_unused_biases(const shard_set *ss, const oe_config *c, int L)
{
    static const char *const names[] = {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
                                        "self_attn.o_proj.bias", "mlp.gate_proj.bias",    "mlp.up_proj.bias",
                                        "mlp.down_proj.bias"};
    for (int i = 0; i < 7; i++) {
        const int used = i < 3 ? c->qkv_bias : i == 3 ? c->qkv_bias && c->arch != OE_ARCH_QWEN2 : 0;
        char nm[256];
        int dup;
        snprintf(nm, sizeof nm, "model.layers.%d.%s", L, names[i]);
        if (used || !find_any(ss, nm, &dup)) continue;
        if (i >= 4)
            return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "checkpoint holds tensor '%s' but config.json gives the MLP "
                                "no biases (mlp_bias false, which transformers follows, leaving the tensor unused); "
                                "the weights and the config are of different models: remove the tensor", nm);
        if (c->no_biases)
            return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "checkpoint holds tensor '%s' but a Mistral model has no "
                                "projection biases (transformers leaves the tensor unused, whatever attention_bias "
                                "says); remove the tensor", nm);
        if (c->arch == OE_ARCH_QWEN2)
            return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "checkpoint holds tensor '%s' but a Qwen2 model has no "
                                "o_proj bias (transformers leaves the tensor unused, whatever attention_bias says); "
                                "remove the tensor", nm);
        return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "checkpoint holds tensor '%s' but config.json has attention_bias "
                            "false (transformers then builds the projection without a bias and leaves the tensor "
                            "unused); set attention_bias to true if the model uses it, or remove the tensor", nm);
    }
    return OSCAR_OK;
}

static oscar_status open_shards(const char *dir, shard_set *ss)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    struct stat isb;
    if (stat(path, &isb) == 0 && !S_ISREG(isb.st_mode)) return oe_check_regular(path, "shard index");
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        ss->n = 0;
        oscar_status s = oe_st_open(path, &ss->st[0]);
        if (s == OSCAR_OK) ss->n = 1;
        return s;
    }
    fclose(f);
    oscar_status rs = oe_check_regular(path, "shard index");
    if (rs != OSCAR_OK) return rs;
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: invalid JSON (%s)", path, jerr.text);
    json_t *wm = json_object_get(root, "weight_map");
    oscar_status s = OSCAR_OK;
    if (!json_is_object(wm)) {
        s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: no weight_map object", path);
        goto done;
    }
    /* Distinct shard names, in first-seen order. */
    const char *names[OE_MAX_SHARDS];
    int nn = 0;
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val)
    {
        if (!json_is_string(val)) {
            s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: weight_map['%s'] is not a file name", path, key);
            goto done;
        }
        const char *fn = json_string_value(val);
        if (!*fn || strchr(fn, '/') || strchr(fn, '\\') || !strcmp(fn, "..")) {
            s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: shard name '%s' must be a plain file name in the "
                             "model directory", path, fn);
            goto done;
        }
        int seen = 0;
        for (int i = 0; i < nn; i++) seen |= !strcmp(names[i], fn);
        if (seen) continue;
        if (nn == OE_MAX_SHARDS) {
            s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: more than %d shards", path, OE_MAX_SHARDS);
            goto done;
        }
        names[nn++] = fn;
    }
    for (int i = 0; i < nn; i++) {
        char sp[4096];
        snprintf(sp, sizeof sp, "%s/%s", dir, names[i]);
        if ((s = oe_st_open(sp, &ss->st[ss->n])) != OSCAR_OK) goto done;
        ss->n++;
    }
    /* Every mapped tensor must be in the shard the index names. */
    json_object_foreach(wm, key, val)
    {
        int found = 0;
        for (int i = 0; i < nn && !found; i++)
            if (!strcmp(names[i], json_string_value(val))) found = oe_st_find(ss->st[i], key) != NULL;
        if (!found) {
            s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "%s: tensor '%s' is not in shard '%s'", path, key,
                             json_string_value(val));
            goto done;
        }
    }
done:
    json_decref(root);
    return s;
}

/* Whether path is one file (same device and inode) as the existing file dir/name. */
static int same_file_in(const char *dir, const char *name, const struct stat *ps)
{
    char fp[4096];
    struct stat sb;
    int n = snprintf(fp, sizeof fp, "%s/%s", dir, name);
    return n > 0 && (size_t)n < sizeof fp && stat(fp, &sb) == 0 && sb.st_dev == ps->st_dev &&
           sb.st_ino == ps->st_ino;
}

int oe_model_reads(const char *dir, const char *path, char *which, size_t n)
{
    struct stat ps;
    if (!dir || !path || stat(path, &ps) != 0) return 0; /* a file that does not exist yet is no input */
    static const char *const fixed[] = {"config.json", "model.safetensors.index.json", "model.safetensors",
                                        "tokenizer.json"};
    const char *hit = NULL;
    for (size_t i = 0; !hit && i < sizeof fixed / sizeof fixed[0]; i++)
        if (same_file_in(dir, fixed[i], &ps)) hit = fixed[i];
    char ip[4096];
    struct stat is;
    json_t *root = NULL; /* a regular index only: a FIFO would block the read */
    if (!hit && (size_t)snprintf(ip, sizeof ip, "%s/model.safetensors.index.json", dir) < sizeof ip &&
        stat(ip, &is) == 0 && S_ISREG(is.st_mode) && (root = json_load_file(ip, 0, NULL)) != NULL) {
        const char *key;
        json_t *val;
        json_t *wm = json_object_get(root, "weight_map");
        json_object_foreach(wm, key, val)
        {
            const char *fn = json_string_value(val);
            if (!hit && fn && *fn && !strchr(fn, '/') && same_file_in(dir, fn, &ps)) hit = fn;
        }
    }
    if (hit && which && n) snprintf(which, n, "%s", hit);
    json_decref(root);
    return hit != NULL;
}

static void free_layer(oe_layer *l)
{
    float **fields[] = {&l->attn_norm, &l->wq, &l->wk, &l->wv, &l->wo, &l->bq, &l->bk, &l->bv, &l->bo,
                        &l->q_norm, &l->k_norm, &l->mlp_norm, &l->w_gate, &l->w_up, &l->w_down,
                        &l->b_gate, &l->b_up, &l->b_down};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) free(*fields[i]);
}

void oe_model_free(oe_model *m)
{
    if (!m) return;
    if (m->layers)
        for (int i = 0; i < m->cfg.num_layers; i++) free_layer(&m->layers[i]);
    free(m->layers);
    if (m->lm_head != m->embed) free(m->lm_head);
    free(m->embed);
    free(m->final_norm);
    free(m);
}

oscar_status oe_model_value_metric(const oe_model *m, int layer, int kv_head, double *M) {
    if (!m || !M) return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_model_value_metric: NULL argument");
    const oe_config *c = &m->cfg;
    if (layer < 0 || layer >= c->num_layers || kv_head < 0 || kv_head >= c->num_kv_heads)
        return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_model_value_metric: layer %d / kv head %d out of range", layer,
                       kv_head);
    const int d = c->head_dim, g = c->num_q_heads / c->num_kv_heads, ld = c->num_q_heads * d;
    const float *wo = m->layers[layer].wo; /* [hidden][Hq d] */
    for (int i = 0; i < d * d; i++) M[i] = 0.0;
    for (int q = kv_head * g; q < (kv_head + 1) * g; q++)
        for (int r = 0; r < c->hidden; r++) {
            const float *row = wo + (size_t)r * (size_t)ld + (size_t)q * (size_t)d;
            for (int i = 0; i < d; i++) {
                double a = row[i];
                if (a == 0.0) continue;
                for (int j = 0; j < d; j++) M[(size_t)i * d + j] += a * row[j];
            }
        }
    return OSCAR_OK;
}

const oe_config *oe_model_config(const oe_model *m) { return m ? &m->cfg : NULL; }

oscar_status oe_model_load(const char *dir, oe_model **out)
{
    if (!dir || !out) return oe_set_error(OSCAR_ERR_INVALID_ARGUMENT, "oe_model_load: NULL argument");
    *out = NULL;
    if (!*dir) /* "" + "/config.json" is the root folder's file */
        return oe_set_error(OSCAR_ERR_IO, "the model directory is an empty path; give the checkpoint's folder");
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    oe_model *m = calloc(1, sizeof *m);
    shard_set *ss = calloc(1, sizeof *ss);
    if (!m || !ss) {
        free(m);
        free(ss);
        return oe_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oe_model_load: out of memory");
    }
    oscar_status s = oe_config_load(path, &m->cfg);
    if (s != OSCAR_OK) goto fail;
    if ((s = open_shards(dir, ss)) != OSCAR_OK) goto fail;
    const oe_config *c = &m->cfg;
    /* The last layer config.json names must be in the checkpoint before anything is sized by the
     * count: num_hidden_layers 2^30 was a 144 GB allocation (out of memory; an abort under ASan). */
    {
        char nm[256];
        float *probe = NULL;
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", c->num_layers - 1);
        if ((s = load_tensor(ss, nm, c->hidden, 0, 0, &probe)) != OSCAR_OK) goto fail;
        free(probe);
    }
    if ((s = check_no_extra_layers(ss, c->num_layers)) != OSCAR_OK) goto fail;
    m->layers = calloc((size_t)c->num_layers, sizeof *m->layers);
    if (!m->layers) {
        s = oe_set_error(OSCAR_ERR_OUT_OF_MEMORY, "oe_model_load: out of memory");
        goto fail;
    }
    const int64_t H = c->hidden, I = c->intermediate, d = c->head_dim, qd = (int64_t)c->num_q_heads * d,
                  kvd = (int64_t)c->num_kv_heads * d;
    if ((s = load_tensor(ss, "model.embed_tokens.weight", c->vocab, H, 0, &m->embed)) != OSCAR_OK) goto fail;
    if ((s = load_tensor(ss, "model.norm.weight", H, 0, 0, &m->final_norm)) != OSCAR_OK) goto fail;
    if (c->tie_word_embeddings) {
        if ((s = check_tied_head(ss, dir, c, m->embed)) != OSCAR_OK) goto fail;
        m->lm_head = m->embed;
    } else {
        if ((s = load_tensor(ss, "lm_head.weight", c->vocab, H, 1, &m->lm_head)) != OSCAR_OK) goto fail;
        if (!m->lm_head) {
            s = oe_set_error(OSCAR_ERR_CORRUPT_FILE, "checkpoint lacks tensor 'lm_head.weight' but %s/config.json "
                             "has tie_word_embeddings false, or no tie_word_embeddings (transformers then reads "
                             "false): a separate output layer; set tie_word_embeddings to true if the model's output "
                             "layer is its input embedding, or add lm_head.weight", dir);
            goto fail;
        }
    }
    for (int L = 0; L < c->num_layers; L++) {
        oe_layer *l = &m->layers[L];
        char nm[256];
        if ((s = check_unused_biases(ss, c, L)) != OSCAR_OK) goto fail;
#define LOAD(field, suffix, d0, d1, opt)                                                           \
    do {                                                                                           \
        snprintf(nm, sizeof nm, "model.layers.%d.%s", L, suffix);                                  \
        if ((s = load_tensor(ss, nm, d0, d1, opt, &l->field)) != OSCAR_OK) goto fail;              \
    } while (0)
        LOAD(attn_norm, "input_layernorm.weight", H, 0, 0);
        LOAD(wq, "self_attn.q_proj.weight", qd, H, 0);
        LOAD(wk, "self_attn.k_proj.weight", kvd, H, 0);
        LOAD(wv, "self_attn.v_proj.weight", kvd, H, 0);
        LOAD(wo, "self_attn.o_proj.weight", H, qd, 0);
        LOAD(bq, "self_attn.q_proj.bias", qd, 0, !c->qkv_bias);
        LOAD(bk, "self_attn.k_proj.bias", kvd, 0, !c->qkv_bias);
        LOAD(bv, "self_attn.v_proj.bias", kvd, 0, !c->qkv_bias);
        LOAD(bo, "self_attn.o_proj.bias", H, 0, 1);
        LOAD(q_norm, "self_attn.q_norm.weight", d, 0, !c->qk_norm);
        LOAD(k_norm, "self_attn.k_norm.weight", d, 0, !c->qk_norm);
        LOAD(mlp_norm, "post_attention_layernorm.weight", H, 0, 0);
        LOAD(w_gate, "mlp.gate_proj.weight", I, H, 0);
        LOAD(w_up, "mlp.up_proj.weight", I, H, 0);
        LOAD(w_down, "mlp.down_proj.weight", H, I, 0);
#undef LOAD
        if (!c->qk_norm && (l->q_norm || l->k_norm)) {
            s = oe_set_error(OSCAR_ERR_UNSUPPORTED, "layer %d has q_norm/k_norm weights but model_type '%s' "
                             "does not use them; check config.json", L, c->model_type);
            goto fail;
        }
    }
    for (int i = 0; i < ss->n; i++) oe_st_close(ss->st[i]);
    free(ss);
    *out = m;
    return OSCAR_OK;
fail:
    for (int i = 0; i < ss->n; i++) oe_st_close(ss->st[i]);
    free(ss);
    oe_model_free(m);
    return s;
}
