/* test_json.c — the strict JSON reader (util/zb_json.h): trees of valid
 * documents, and each refusal with a message that names the problem and
 * where it is. */
#include "zb_json.h"
#include "zbtest.h"

static zb_json *parse_ok(const char *text) {
  zb_json *j = NULL;
  zb_diag d = {{0}};
  zb_err err = zb_json_parse(text, strlen(text), &j, &d);
  if (err != ZB_OK)
    fprintf(stderr, "  unexpected failure on %s: %s\n", text, d.msg);
  return j;
}

/* The parse of text fails with a message containing each of want[]. */
static int refuses(const char *text, size_t len, const char *want1, const char *want2) {
  zb_json *j = (zb_json *)1;
  zb_diag d = {{0}};
  zb_err err = zb_json_parse(text, len, &j, &d);
  if (err != ZB_ERR_PARSE || j != NULL) {
    fprintf(stderr, "  accepted (or wrong error %d): %.60s\n", (int)err, text);
    zb_json_free(j);
    return 0;
  }
  if (!strstr(d.msg, want1) || (want2 && !strstr(d.msg, want2))) {
    fprintf(stderr, "  message \"%s\" lacks \"%s\" / \"%s\"\n", d.msg, want1, want2 ? want2 : "");
    return 0;
  }
  return 1;
}
#define REFUSES(text, w1, w2) CHECK(refuses(text, strlen(text), w1, w2))

static void test_nested_document(void) {
  zb_json *j =
      parse_ok(" {\"a\": [1, 2.5, {\"b\": null}], \"c\": true, \"d\": false, \"e\": {}, \"f\": []}\n");
  CHECK(j);
  CHECK_EQ(j->kind, ZB_JSON_OBJECT);
  CHECK_EQ(j->n, 5);
  CHECK_EQ(j->offset, 1);
  CHECK_STREQ(j->keys[0], "a");
  const zb_json *a = zb_json_get(j, "a");
  CHECK(a && a->kind == ZB_JSON_ARRAY && a->n == 3);
  CHECK_EQ(a->offset, 7);
  CHECK(a->items[0].is_integer && a->items[0].integer == 1);
  CHECK(!a->items[1].is_integer && a->items[1].number == 2.5);
  CHECK_EQ(zb_json_get(&a->items[2], "b")->kind, ZB_JSON_NULL);
  CHECK(zb_json_get(j, "c")->boolean == 1 && zb_json_get(j, "d")->boolean == 0);
  CHECK_EQ(zb_json_get(j, "e")->kind, ZB_JSON_OBJECT);
  CHECK_EQ(zb_json_get(j, "e")->n, 0);
  CHECK_EQ(zb_json_get(j, "f")->n, 0);
  CHECK(zb_json_get(j, "missing") == NULL);
  CHECK(zb_json_get(a, "a") == NULL);
  CHECK(zb_json_get(NULL, "a") == NULL);
  CHECK_STREQ(zb_json_kind_name(a->kind), "array");
  CHECK_STREQ(zb_json_kind_name(ZB_JSON_BOOL), "boolean");
  CHECK_STREQ(zb_json_kind_phrase(ZB_JSON_ARRAY), "an array");
  zb_json_free(j);
  zb_json_free(NULL);
}

static void test_string_escapes(void) {
  zb_json *j = parse_ok(
      "[\"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t\", \"\\u00e9\\u20AC\", \"\\ud83d\\ude00\", \"h\xc3\xa9\"]");
  CHECK(j && j->n == 4);
  CHECK_STREQ(j->items[0].string, "q\" b\\ s/ \b\f\n\r\t");
  CHECK_EQ(j->items[0].len, 14);
  CHECK_STREQ(j->items[1].string, "\xc3\xa9\xe2\x82\xac");
  CHECK_STREQ(j->items[2].string, "\xf0\x9f\x98\x80"); /* U+1F600 from its surrogate pair */
  CHECK_EQ(j->items[2].len, 4);
  CHECK_STREQ(j->items[3].string, "h\xc3\xa9");
  zb_json_free(j);
}

static void test_numbers(void) {
  zb_json *j = parse_ok("[0, -0, 1e3, -2.5E-2, 1E+2, 9007199254740992, -9007199254740992, 9007199254740993, "
                        "123456789012345678901234567890, 1e-400, 0.0]");
  CHECK(j && j->n == 11);
  CHECK(j->items[0].is_integer && j->items[0].integer == 0);
  CHECK(j->items[1].is_integer && j->items[1].integer == 0);
  CHECK(!j->items[2].is_integer && j->items[2].number == 1000.0);
  CHECK(j->items[3].number == -0.025);
  CHECK(!j->items[4].is_integer && j->items[4].number == 100.0);
  CHECK(j->items[5].is_integer && j->items[5].integer == 9007199254740992LL);
  CHECK(j->items[6].is_integer && j->items[6].integer == -9007199254740992LL);
  CHECK(!j->items[7].is_integer); /* past 2^53: a double only */
  CHECK(!j->items[8].is_integer && j->items[8].number > 1.2e29);
  CHECK(j->items[9].number == 0.0);
  CHECK(!j->items[10].is_integer);
  zb_json_free(j);
  j = parse_ok("42");
  CHECK(j && j->kind == ZB_JSON_NUMBER && j->integer == 42);
  zb_json_free(j);
}

static void test_depth_limit(void) {
  char deep[2 * 65 + 1];
  for (int i = 0; i < 64; i++)
    deep[i] = '[', deep[64 + i] = ']';
  deep[128] = '\0';
  zb_json *j = parse_ok(deep);
  CHECK(j);
  zb_json_free(j);
  for (int i = 0; i < 65; i++)
    deep[i] = '[', deep[65 + i] = ']';
  deep[130] = '\0';
  REFUSES(deep, "nesting deeper than 64", "byte 64");
}

static void test_refusals_structure(void) {
  REFUSES("", "unexpected end of text", "byte 0");
  REFUSES("{\"a\": [1, 2", "unexpected end of text in an array", NULL);
  REFUSES("{\"a\": 1", "unexpected end of text in an object", NULL);
  REFUSES("{\"a\"", "unexpected end of text", NULL);
  REFUSES("[tru", "unexpected end of text in a literal", NULL);
  REFUSES("{\"a\": 1, \"b\": 2, \"a\": 3}", "duplicate key \"a\"", "byte 17");
  REFUSES("[1, 2,]", "trailing comma in an array", "byte 5");
  REFUSES("{\"a\": 1,}", "trailing comma in an object", NULL);
  REFUSES("[1 2]", "expected ',' or ']'", NULL);
  REFUSES("{1: 2}", "expected a key string", NULL);
  REFUSES("{\"a\" 2}", "expected ':'", NULL);
  REFUSES("{} x", "trailing characters", "byte 3");
  REFUSES("[1] [2]", "trailing characters", NULL);
  REFUSES("[NaN]", "unexpected character 'N'", "byte 1");
  REFUSES("Infinity", "unexpected character 'I'", NULL);
  REFUSES("// c\n{}", "unexpected character '/'", NULL);
  REFUSES("'a'", "unexpected character", NULL);
}

static void test_refusals_numbers(void) {
  REFUSES("01", "leading zero", "byte 0");
  REFUSES("[-012]", "leading zero", "byte 1");
  REFUSES("-", "unexpected end of text in a number", NULL);
  REFUSES("-x", "digits after '-'", NULL);
  REFUSES("1.", "digits after '.'", NULL);
  REFUSES(".5", "unexpected character '.'", NULL);
  REFUSES("1e", "exponent", NULL);
  REFUSES("+1", "unexpected character '+'", NULL);
  REFUSES("1e400", "out of range", NULL);
  REFUSES("-1e400", "out of range", NULL);
}

static void test_refusals_strings(void) {
  REFUSES("\"abc", "unexpected end of text in a string", "byte 4");
  REFUSES("\"a\nb\"", "control character 0x0a", "byte 2");
  REFUSES("\"a\tb\"", "control character 0x09", NULL);
  REFUSES("\"\\x\"", "invalid escape '\\x'", "byte 1");
  REFUSES("\"\\u12G4\"", "four hex digits", NULL);
  REFUSES("\"\\u12", "unexpected end of text in a \\u escape", NULL);
  REFUSES("\"\\u0000\"", "\\u0000", NULL);
  REFUSES("\"\\ud800\"", "lone high surrogate", NULL);
  REFUSES("\"\\ud800\\u0041\"", "lone high surrogate", NULL);
  REFUSES("\"\\udc00\"", "lone low surrogate", NULL);
  REFUSES("\"\xc3\"", "invalid UTF-8", "byte 1");
  REFUSES("\"\xc0\xaf\"", "invalid UTF-8", NULL);         /* overlong '/' */
  REFUSES("\"\xed\xa0\x80\"", "invalid UTF-8", NULL);     /* an encoded surrogate */
  REFUSES("\"\xf4\x90\x80\x80\"", "invalid UTF-8", NULL); /* past U+10FFFF */
  REFUSES("\"\xff\"", "invalid UTF-8", NULL);
  CHECK(refuses("\"a\0b\"", 5, "control character 0x00", NULL));
  CHECK(refuses("[1]\0", 4, "trailing characters", NULL));
}

/* text need not be NUL-terminated: only len bytes are read. */
static void test_length_bound(void) {
  zb_json *j = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_json_parse("[1]]]", 3, &j, &d), ZB_OK);
  CHECK(j && j->n == 1);
  zb_json_free(j);
  CHECK(refuses("{\"key\": 12}", 8, "unexpected end of text", "byte 8"));
}

ZBT_MAIN(ZBT(test_nested_document), ZBT(test_string_escapes), ZBT(test_numbers), ZBT(test_depth_limit),
         ZBT(test_refusals_structure), ZBT(test_refusals_numbers), ZBT(test_refusals_strings),
         ZBT(test_length_bound))
