/* test_arch.c — architectures as data (zb_arch.h, zb_arch_hf.h): the
 * parameter counts of published configurations as their authors state
 * them (GPT-2 124M, LLaMA-2 7B, LLaMA-3 8B), the tensor names and layouts
 * transformers uses, where a partition puts each tensor, and every
 * config.json refusal naming its key. */
#include <stdio.h>
#include <string.h>

#include "zb_arch.h"
#include "zb_arch_hf.h"
#include "zbtest.h"

static const char gpt2_config[] =
    "{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"], \"attn_pdrop\": 0.1,"
    " \"bos_token_id\": 50256, \"embd_pdrop\": 0.1, \"eos_token_id\": 50256, \"initializer_range\": 0.02,"
    " \"layer_norm_epsilon\": 1e-05, \"model_type\": \"gpt2\", \"n_ctx\": 1024, \"n_embd\": 768,"
    " \"n_head\": 12, \"n_layer\": 12, \"n_positions\": 1024, \"resid_pdrop\": 0.1,"
    " \"summary_activation\": null, \"summary_first_dropout\": 0.1, \"summary_proj_to_labels\": true,"
    " \"summary_type\": \"cls_index\", \"summary_use_proj\": true,"
    " \"task_specific_params\": {\"text-generation\": {\"do_sample\": true, \"max_length\": 50}},"
    " \"vocab_size\": 50257}";

static const char llama2_7b_config[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 11008, \"max_position_embeddings\": 4096, \"model_type\": \"llama\","
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 32,"
    " \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": null, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"float16\", \"transformers_version\": \"4.31.0.dev0\", \"use_cache\": true,"
    " \"vocab_size\": 32000}";

static const char llama31_8b_config[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 128000, \"eos_token_id\": 128001, \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 14336, \"max_position_embeddings\": 131072,"
    " \"mlp_bias\": false, \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,"
    " \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
    " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"transformers_version\": "
    "\"4.43.0.dev0\","
    " \"use_cache\": true, \"vocab_size\": 128256}";

static zb_arch parse_ok(const char *text, char *notes, size_t notes_len) {
  zb_arch a;
  memset(&a, 0, sizeof a);
  zb_diag d = {{0}};
  zb_err e = zb_arch_from_hf_text(text, strlen(text), &a, notes, notes_len, &d);
  if (e != ZB_OK)
    fprintf(stderr, "  unexpected refusal: %s\n", d.msg);
  return a;
}

static void test_published_parameter_counts(void) {
  char notes[256];
  zb_arch g = parse_ok(gpt2_config, notes, sizeof notes);
  CHECK_EQ(g.kind, ZB_ARCH_GPT2);
  CHECK_EQ(zb_arch_param_count(&g), 124439808LL); /* GPT-2 small as transformers counts it */
  CHECK_EQ(g.vocab_padded, 50304);
  CHECK(strstr(notes, "resid_pdrop 0.1 not applied") != NULL);
  zb_arch l2 = parse_ok(llama2_7b_config, NULL, 0);
  CHECK_EQ(l2.kind, ZB_ARCH_LLAMA);
  CHECK_EQ(zb_arch_param_count(&l2), 6738415616LL); /* LLaMA-2 7B */
  zb_arch l3 = parse_ok(llama31_8b_config, notes, sizeof notes);
  CHECK_EQ(zb_arch_param_count(&l3), 8030261248LL); /* LLaMA-3.1 8B */
  CHECK_STREQ(notes, "");                           /* attention_dropout 0.0 changes nothing */
  CHECK_EQ(l3.kv_heads, 8);
  CHECK_EQ(l3.head_dim, 128);
  CHECK_EQ(l3.rope.scaling, ZB_ROPE_LLAMA3);
  CHECK_NEAR(l3.rope.theta, 500000.0, 0);
  CHECK_NEAR(l3.rope.factor, 8.0, 0);
  CHECK_EQ(l3.rope.original_max_positions, 8192);
}

static int find(const zb_arch_tensor *ts, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(ts[i].hf_name, name) == 0)
      return i;
  return -1;
}

static void test_gpt2_layout_and_tied_head(void) {
  zb_arch g = parse_ok(gpt2_config, NULL, 0);
  zb_arch_tensor ts[200];
  int n = 0;
  CHECK_EQ(zb_arch_stage_tensors(&g, 0, 1, ts, 200, &n, NULL), ZB_OK);
  CHECK_EQ(n, 2 + 12 * 12 + 2); /* wte, wpe, 12 per block, ln_f; the head is wte */
  int qkv = find(ts, n, "transformer.h.3.attn.c_attn.weight");
  CHECK(qkv >= 0);
  CHECK_EQ(ts[qkv].rows, 3 * 768);
  CHECK_EQ(ts[qkv].cols, 768);
  CHECK(ts[qkv].hf_transposed); /* Conv1D keeps [in, out] */
  int wte = find(ts, n, "transformer.wte.weight");
  CHECK(wte == 0 && ts[wte].rows == 50304 && ts[wte].hf_rows == 50257 && !ts[wte].hf_transposed);
  CHECK(find(ts, n, "lm_head.weight") < 0);
  /* over two stages the last holds a second copy of wte as its head */
  CHECK_EQ(zb_arch_stage_tensors(&g, 1, 2, ts, 200, &n, NULL), ZB_OK);
  CHECK_EQ(n, 6 * 12 + 2 + 1);
  CHECK(ts[n - 1].tied_copy && ts[n - 1].role == ZB_T_HEAD);
  CHECK_STREQ(ts[n - 1].hf_name, "transformer.wte.weight");
  CHECK_STREQ(ts[0].hf_name, "transformer.h.6.ln_1.weight");
  int stage = -1;
  CHECK_EQ(zb_arch_tensor_stage(&g, 2, "transformer.wte.weight", &stage, NULL), ZB_OK);
  CHECK_EQ(stage, 0); /* the tied weight's home is the first stage */
}

static void test_llama_gqa_shapes_and_stages(void) {
  zb_arch l = parse_ok(llama31_8b_config, NULL, 0);
  l.layers = 5;
  zb_arch_tensor ts[200];
  int n = 0;
  CHECK_EQ(zb_arch_stage_tensors(&l, 2, 3, ts, 200, &n, NULL), ZB_OK); /* blocks 3 and 4, norm, head */
  CHECK_EQ(n, 2 * 9 + 2);
  int q = find(ts, n, "model.layers.3.self_attn.q_proj.weight");
  int k = find(ts, n, "model.layers.3.self_attn.k_proj.weight");
  int o = find(ts, n, "model.layers.4.self_attn.o_proj.weight");
  int gate = find(ts, n, "model.layers.4.mlp.gate_proj.weight");
  CHECK(q >= 0 && k >= 0 && o >= 0 && gate >= 0);
  CHECK(ts[q].rows == 4096 && ts[k].rows == 1024 && ts[k].cols == 4096);
  CHECK(ts[o].rows == 4096 && ts[o].cols == 4096 && ts[gate].rows == 14336);
  CHECK(!ts[q].hf_transposed && ts[find(ts, n, "model.norm.weight")].hf_vector);
  CHECK_STREQ(ts[n - 1].hf_name, "lm_head.weight");
  int stage = -1;
  CHECK_EQ(zb_arch_tensor_stage(&l, 3, "model.layers.2.mlp.down_proj.weight", &stage, NULL), ZB_OK);
  CHECK_EQ(stage, 1);
  CHECK_EQ(zb_arch_tensor_stage(&l, 3, "lm_head.weight", &stage, NULL), ZB_OK);
  CHECK_EQ(stage, 2);
  zb_diag d = {{0}};
  CHECK_EQ(zb_arch_tensor_stage(&l, 3, "model.layers.2.self_attn.q_proj.bias", &stage, &d),
           ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "q_proj.bias") != NULL);
  CHECK_EQ(zb_arch_tensor_stage(&l, 3, "model.layers.02.mlp.up_proj.weight", &stage, NULL),
           ZB_ERR_INVALID_ARG);
  CHECK_EQ(zb_arch_tensor_stage(&l, 3, "model.layers.5.mlp.up_proj.weight", &stage, NULL),
           ZB_ERR_INVALID_ARG);
}

static void test_builtin_keeps_zb_names(void) {
  zb_arch b = zb_arch_builtin(0, 64, 4, 2, 32);
  zb_arch_tensor ts[200];
  int n = 0;
  CHECK_EQ(zb_arch_stage_tensors(&b, 0, 1, ts, 200, &n, NULL), ZB_OK);
  CHECK_EQ(n, 2 + 2 * 12 + 3);
  CHECK_STREQ(ts[0].hf_name, "embed.weight");
  CHECK_STREQ(ts[2].hf_name, "layer0.ln1.weight");
  CHECK_STREQ(ts[n - 1].hf_name, "head.weight");
  CHECK_EQ(ts[0].rows, 256);
  /* sizing call: cap 0 counts without writing */
  int m = -1;
  CHECK_EQ(zb_arch_stage_tensors(&b, 0, 1, NULL, 0, &m, NULL), ZB_OK);
  CHECK_EQ(m, n);
}

/* Each text is refused with a message holding `needle`. */
static void expect_refusal(const char *text, const char *needle) {
  zb_arch a;
  zb_diag d = {{0}};
  zb_err e = zb_arch_from_hf_text(text, strlen(text), &a, NULL, 0, &d);
  CHECK_MSG(e != ZB_OK, "accepted: %s", text);
  CHECK_MSG(strstr(d.msg, needle) != NULL, "message \"%s\" lacks \"%s\"", d.msg, needle);
}

#define LLAMA_BASE                                                                                           \
  "\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 160, \"num_hidden_layers\": 2, "   \
  "\"num_attention_heads\": 4, \"max_position_embeddings\": 64, \"vocab_size\": 512"

static void test_config_refusals_name_the_key(void) {
  expect_refusal("{" LLAMA_BASE ", \"sliding_window\": 4096}", "sliding_window");
  expect_refusal("{" LLAMA_BASE ", \"hidden_act\": \"gelu\"}", "hidden_act 'gelu'");
  expect_refusal("{" LLAMA_BASE ", \"attention_bias\": true}", "attention_bias");
  expect_refusal("{" LLAMA_BASE ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}", "yarn");
  expect_refusal("{" LLAMA_BASE ", \"num_key_value_heads\": 3}", "num_key_value_heads 3");
  expect_refusal("{" LLAMA_BASE ", \"pretraining_tp\": 2}", "pretraining_tp");
  expect_refusal("{\"model_type\": \"llama\", \"vocab_size\": 1.5}", "vocab_size must be an integer");
  expect_refusal("{\"model_type\": \"mistral\"}", "model_type 'mistral'");
  expect_refusal("{\"model_type\": \"llama\", \"vocab_size\": 8, \"hidden_size\": 64}",
                 "no intermediate_size");
  expect_refusal("[1, 2]", "must hold an object");
  expect_refusal(
      "{\"model_type\": \"gpt2\", \"n_embd\": 100, \"n_head\": 3, \"n_layer\": 1, \"n_positions\": 8,"
      " \"vocab_size\": 10}",
      "not a multiple of n_head");
  expect_refusal(
      "{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_head\": 4, \"n_layer\": 1, \"n_positions\": 8,"
      " \"vocab_size\": 10, \"activation_function\": \"relu\"}",
      "activation_function 'relu'");
  expect_refusal(
      "{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_head\": 4, \"n_layer\": 1, \"n_positions\": 8,"
      " \"vocab_size\": 10, \"scale_attn_by_inverse_layer_idx\": true}",
      "scale_attn_by_inverse_layer_idx");
  zb_arch a;
  zb_diag d = {{0}};
  const char ok[] = "{" LLAMA_BASE ", \"num_key_value_heads\": 2, \"tie_word_embeddings\": true}";
  CHECK_EQ(zb_arch_from_hf_text(ok, strlen(ok), &a, NULL, 0, &d), ZB_OK);
  CHECK(a.tied && a.kv_heads == 2 && a.head_dim == 16 && a.vocab_padded == 512);
  CHECK_NEAR(a.norm_eps, 1e-6, 0); /* LlamaConfig's default */
}

static void test_kind_names(void) {
  zb_arch_kind k;
  zb_diag d = {{0}};
  CHECK_EQ(zb_arch_kind_parse("llama", &k, NULL), ZB_OK);
  CHECK_EQ(k, ZB_ARCH_LLAMA);
  CHECK_STREQ(zb_arch_kind_name(ZB_ARCH_GPT2), "gpt2");
  CHECK_EQ(zb_arch_kind_parse("bert", &k, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "'bert'") != NULL);
}

ZBT_MAIN(ZBT(test_published_parameter_counts), ZBT(test_gpt2_layout_and_tied_head),
         ZBT(test_llama_gqa_shapes_and_stages), ZBT(test_builtin_keeps_zb_names),
         ZBT(test_config_refusals_name_the_key), ZBT(test_kind_names))
