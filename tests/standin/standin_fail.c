/* standin_fail.c — error injection for the CPU stand-in (test-only;
 * docs/model.md, The CPU stand-in, Error injection): makes a chosen CUDA,
 * cuBLAS, kernel-launch or NCCL call fail, so a test shows that zb checks
 * every status it is handed.
 *
 * Every injectable call asks standin_inject(api, site), site being the
 * caller's return address. Knobs (environment, read once):
 * - ZB_STANDIN_FAIL="api:N,api:N": the Nth call of api fails, and every
 *   later call of api too (a failure that persists, as an out-of-memory or
 *   a lost device does, so a retry cannot hide an unchecked status);
 * - ZB_STANDIN_FAIL_SITE="api@OFFSET": the first call of api from the call
 *   site at OFFSET (hex, from its module's base, as the list gives it)
 *   fails, and every later call of api;
 * - ZB_STANDIN_SITES=PATH: appends every distinct (api, site) to PATH as
 *   "api@OFFSET symbol" when first seen (what a sweep iterates over).
 * A failure that fires is printed as "cuda stand-in: injected failure: ...".
 *
 * Threads: g_mu guards the tables.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin_internal.h"

#define MAX_RULES 16
#define MAX_SITES 4096

typedef struct rule {
  char api[48];
  long n, calls;  /* fail from the nth call on (n >= 1) */
  uintptr_t site; /* ZB_STANDIN_FAIL_SITE: 0 for ZB_STANDIN_FAIL's rules */
  bool fired;
} rule;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static rule g_rules[MAX_RULES];
static int g_nrules;
static const char *g_sites_path;
static struct {
  const char *api;
  uintptr_t site;
} g_seen[MAX_SITES];
static int g_nseen;
static char g_fired[48];

static void add_rule(const char *spec, char sep, bool site) {
  const char *at = strchr(spec, sep);
  if (!at || at == spec || (size_t)(at - spec) >= sizeof g_rules[0].api || g_nrules == MAX_RULES) {
    fprintf(stderr, "cuda stand-in: '%s' is not api%cN; ignored\n", spec, sep);
    return;
  }
  char *end;
  unsigned long long v = strtoull(at + 1, &end, site ? 16 : 10);
  if (*end || (!site && v == 0)) {
    fprintf(stderr, "cuda stand-in: '%s' is not api%cN; ignored\n", spec, sep);
    return;
  }
  rule *r = &g_rules[g_nrules++];
  *r = (rule){0};
  memcpy(r->api, spec, (size_t)(at - spec));
  r->n = site ? 1 : (long)v;
  r->site = site ? (uintptr_t)v : 0;
}

static void read_env(void) {
  const char *s = getenv("ZB_STANDIN_FAIL");
  char buf[512];
  if (s && *s) {
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
      add_rule(tok, ':', false);
  }
  if ((s = getenv("ZB_STANDIN_FAIL_SITE")) && *s)
    add_rule(s, '@', true);
  g_sites_path = getenv("ZB_STANDIN_SITES");
}

/* The site's offset from its module's base: the same in every run of a
 * binary, whatever the address space layout. */
static uintptr_t site_offset(const void *site, const char **sym) {
  Dl_info info;
  *sym = "?";
  if (!site || !dladdr(site, &info) || !info.dli_fbase)
    return (uintptr_t)site;
  if (info.dli_sname)
    *sym = info.dli_sname;
  return (uintptr_t)site - (uintptr_t)info.dli_fbase;
}

/* Under g_mu: records (api, site) in the list the first time it is seen. */
static void list_site(const char *api, uintptr_t off, const char *sym) {
  for (int i = 0; i < g_nseen; i++)
    if (g_seen[i].site == off && strcmp(g_seen[i].api, api) == 0)
      return;
  if (g_nseen == MAX_SITES)
    return;
  g_seen[g_nseen].api = api;
  g_seen[g_nseen++].site = off;
  FILE *f = fopen(g_sites_path, "a");
  if (f) {
    fprintf(f, "%s@%lx %s\n", api, (unsigned long)off, sym);
    fclose(f);
  }
}

bool standin_inject(const char *api, const void *site) {
  pthread_once(&g_once, read_env);
  if (!g_nrules && !g_sites_path)
    return false;
  const char *sym;
  uintptr_t off = site_offset(site, &sym);
  bool fail = false;
  pthread_mutex_lock(&g_mu);
  if (g_sites_path)
    list_site(api, off, sym);
  for (int i = 0; i < g_nrules; i++) {
    rule *r = &g_rules[i];
    if (strcmp(r->api, api) != 0)
      continue;
    bool here = r->site == 0 || r->site == off;
    if (r->fired || (here && ++r->calls >= r->n)) {
      if (!r->fired)
        fprintf(stderr, "cuda stand-in: injected failure: %s (call %ld, site %s+%lx)\n", api, r->calls, sym,
                (unsigned long)off);
      r->fired = fail = true;
      snprintf(g_fired, sizeof g_fired, "%s", api);
    }
  }
  pthread_mutex_unlock(&g_mu);
  return fail;
}

void standin_fail_set(const char *spec) {
  pthread_once(&g_once, read_env);
  pthread_mutex_lock(&g_mu);
  g_nrules = 0;
  g_fired[0] = '\0';
  char buf[512];
  snprintf(buf, sizeof buf, "%s", spec ? spec : "");
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
    add_rule(tok, ':', false);
  pthread_mutex_unlock(&g_mu);
}

const char *standin_fail_fired(void) {
  pthread_mutex_lock(&g_mu);
  const char *r = g_fired[0] ? g_fired : NULL;
  pthread_mutex_unlock(&g_mu);
  return r;
}
