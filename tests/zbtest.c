#include "zbtest.h"

int zbt_run(const zbt_case *cases, int n, int argc, char **argv) {
  int failed = 0, ran = 0;
  for (int i = 0; i < n; i++) {
    if (argc > 1) {
      int selected = 0;
      for (int a = 1; a < argc; a++)
        selected |= strcmp(argv[a], cases[i].name) == 0;
      if (!selected)
        continue;
    }
    int before = zbt_failed_checks;
    cases[i].fn();
    ran++;
    if (zbt_failed_checks != before) {
      failed++;
      fprintf(stderr, "FAIL %s\n", cases[i].name);
    } else {
      printf("ok   %s\n", cases[i].name);
    }
  }
  printf("%d/%d tests passed\n", ran - failed, ran);
  return failed ? 1 : 0;
}
