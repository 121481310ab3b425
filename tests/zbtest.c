#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

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

void zbt_remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
      if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
        unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
  }
  if (rmdir(dir) != 0) {
    fprintf(stderr, "  cannot remove %s\n", dir);
    zbt_failed_checks++;
  }
}
