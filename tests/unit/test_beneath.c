/* Opening beneath a held directory (util/zb_beneath.h) and the root set
 * over it (util/zb_roots.h, a worker's --path-root), on real files: files
 * inside a root open; a symbolic link anywhere in the path (a directory
 * replaced by one, the last component, one pointing back inside), a "."
 * or "..", or an absolute name is refused with ELOOP or EXDEV, and
 * nothing is created outside. Every case runs through both openers: the
 * openat2(2) one (zb_beneath_open, where the kernel has it) and the walk
 * it falls back to (zb_beneath_open_walk). */
#define _GNU_SOURCE /* nftw's FTW_PHYS, SYS_openat2 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "zb_beneath.h"
#include "zb_file.h"
#include "zb_roots.h"
#include "zbtest.h"

typedef int (*opener)(int dirfd, const char *rel, int flags, mode_t mode);

static const struct {
  const char *name;
  opener open;
} openers[] = {{"openat2", zb_beneath_open}, {"walk", zb_beneath_open_walk}};

/* base/root is the root, base/outside a directory beside it that must
 * stay empty. */
static char base[64], root[96], outside[96];

static int remove_one(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
  (void)sb;
  (void)type;
  (void)ftw;
  return remove(path);
}

static void make_tree(void) {
  snprintf(base, sizeof base, "/tmp/zb-test-beneath-XXXXXX");
  if (!mkdtemp(base)) {
    perror("mkdtemp");
    exit(1);
  }
  snprintf(root, sizeof root, "%s/root", base);
  snprintf(outside, sizeof outside, "%s/outside", base);
  mkdir(root, 0755);
  mkdir(outside, 0755);
}

static void remove_tree(void) {
  nftw(base, remove_one, 16, FTW_DEPTH | FTW_PHYS); /* links removed, never followed */
}

/* Entries in dir besides "." and "..". */
static int entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  if (d)
    closedir(d);
  return n;
}

/* A path under the root (or outside). */
static const char *at(const char *top, const char *rel) {
  static char buf[4][256];
  static int k;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", top, rel);
  return buf[k];
}

/* fd >= 0: closes it and says true; else false. */
static bool opened(int fd) {
  if (fd < 0)
    return false;
  close(fd);
  return true;
}

static int root_fd(void) {
  return open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
}

static void test_files_inside_open(void) {
  for (size_t k = 0; k < sizeof openers / sizeof openers[0]; k++) {
    make_tree();
    opener op = openers[k].open;
    int rfd = root_fd();
    mkdir(at(root, "a"), 0755);
    mkdir(at(root, "a/b"), 0755);
    CHECK_MSG(opened(op(rfd, "a/b/f", O_WRONLY | O_CREAT, 0644)), "%s: create a/b/f: %s", openers[k].name,
              strerror(errno));
    CHECK_MSG(opened(op(rfd, "a//b/f", O_RDONLY, 0)), "%s: a//b/f", openers[k].name);
    CHECK(opened(op(rfd, "a/b", O_RDONLY | O_DIRECTORY, 0)));
    CHECK(opened(op(rfd, "", O_RDONLY | O_DIRECTORY, 0))); /* the root itself */
    errno = 0;
    CHECK_EQ(op(rfd, "a/none/f", O_WRONLY | O_CREAT, 0644), -1); /* missing directories are not made */
    CHECK_EQ(errno, ENOENT);
    struct stat sb;
    CHECK_EQ(stat(at(root, "a/b/f"), &sb), 0);
    close(rfd);
    remove_tree();
  }
}

/* A directory inside the root replaced by a link: to outside, and to
 * another directory inside (no link is followed at all). */
static void test_directory_swapped_for_a_link(void) {
  for (size_t k = 0; k < sizeof openers / sizeof openers[0]; k++) {
    make_tree();
    opener op = openers[k].open;
    int rfd = root_fd();
    mkdir(at(root, "ck"), 0755);
    mkdir(at(root, "ck/job"), 0755);
    CHECK(opened(op(rfd, "ck/job/rank0.ckpt", O_WRONLY | O_CREAT, 0644)));
    CHECK_EQ(rename(at(root, "ck/job"), at(root, "ck/job.old")), 0);
    CHECK_EQ(symlink(outside, at(root, "ck/job")), 0);
    errno = 0;
    CHECK_EQ(op(rfd, "ck/job/rank0.ckpt", O_WRONLY | O_CREAT | O_TRUNC, 0644), -1);
    CHECK_MSG(errno == ELOOP, "%s: errno %d (%s), expected ELOOP", openers[k].name, errno, strerror(errno));
    CHECK_EQ(op(rfd, "ck/job", O_RDONLY | O_DIRECTORY, 0), -1); /* as the last component too */
    CHECK_EQ(errno, ELOOP);
    CHECK_EQ(op(rfd, "ck/job/new/deeper", O_WRONLY | O_CREAT, 0644), -1);
    CHECK_EQ(errno, ELOOP);
    CHECK_EQ(unlink(at(root, "ck/job")), 0);
    CHECK_EQ(symlink("job.old", at(root, "ck/job")), 0); /* back inside: still refused */
    CHECK_EQ(op(rfd, "ck/job/rank0.ckpt", O_RDONLY, 0), -1);
    CHECK_EQ(errno, ELOOP);
    CHECK_MSG(entries(outside) == 0, "%s: %d files written outside the root", openers[k].name,
              entries(outside));
    close(rfd);
    remove_tree();
  }
}

static void test_last_component_link(void) {
  for (size_t k = 0; k < sizeof openers / sizeof openers[0]; k++) {
    make_tree();
    opener op = openers[k].open;
    int rfd = root_fd();
    /* dangling, to a file a create would make outside */
    CHECK_EQ(symlink(at(outside, "planted"), at(root, "dump.bin")), 0);
    errno = 0;
    CHECK_EQ(op(rfd, "dump.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644), -1);
    CHECK_MSG(errno == ELOOP, "%s: errno %d (%s)", openers[k].name, errno, strerror(errno));
    FILE *f = fopen(at(outside, "secret"), "w");
    CHECK(f != NULL);
    fclose(f);
    CHECK_EQ(symlink(at(outside, "secret"), at(root, "text.txt")), 0);
    CHECK_EQ(op(rfd, "text.txt", O_RDONLY, 0), -1);
    CHECK_EQ(errno, ELOOP);
    CHECK_MSG(entries(outside) == 1, "%s: outside holds %d files, expected only 'secret'", openers[k].name,
              entries(outside));
    close(rfd);
    remove_tree();
  }
}

static void test_dots_and_absolute_names(void) {
  const char *bad[] = {"../outside/x", "a/../../outside/x", "a/..", "./x", "a/./x", "..", "/tmp/x"};
  for (size_t k = 0; k < sizeof openers / sizeof openers[0]; k++) {
    make_tree();
    opener op = openers[k].open;
    int rfd = root_fd();
    mkdir(at(root, "a"), 0755);
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
      errno = 0;
      CHECK_EQ(op(rfd, bad[b], O_WRONLY | O_CREAT, 0644), -1);
      CHECK_MSG(errno == EXDEV, "%s '%s': errno %d (%s), expected EXDEV", openers[k].name, bad[b], errno,
                strerror(errno));
    }
    CHECK_EQ(entries(outside), 0);
    CHECK_EQ(entries(root), 1); /* "a" only */
    close(rfd);
    remove_tree();
  }
}

static void test_mkdirs(void) {
  make_tree();
  int rfd = root_fd();
  CHECK_EQ(zb_beneath_mkdirs(rfd, "m/n/o", 0755), 0);
  CHECK_EQ(zb_beneath_mkdirs(rfd, "m/n/o", 0755), 0); /* there already */
  struct stat sb;
  CHECK(stat(at(root, "m/n/o"), &sb) == 0 && S_ISDIR(sb.st_mode));
  CHECK_EQ(rename(at(root, "m/n"), at(root, "m/n.old")), 0);
  CHECK_EQ(symlink(outside, at(root, "m/n")), 0);
  errno = 0;
  CHECK_EQ(zb_beneath_mkdirs(rfd, "m/n/o/p", 0755), -1);
  CHECK_EQ(errno, ELOOP);
  CHECK_EQ(zb_beneath_mkdirs(rfd, "m/../../outside/q", 0755), -1);
  CHECK_EQ(errno, EXDEV);
  CHECK_EQ(entries(outside), 0);
  close(rfd);
  remove_tree();
}

/* The root set: a path is matched to its root by name and every file
 * operation stays beneath it; with no roots the same calls follow links
 * as they always did. */
static void test_roots_file_operations(void) {
  make_tree();
  zb_roots rs = {0};
  zb_diag d = {{0}};
  CHECK_EQ(zb_roots_add(&rs, root, &d), ZB_OK);
  CHECK_EQ(zb_roots_add(&rs, at(base, "missing"), &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "missing") != NULL);
  CHECK_EQ(zb_file_mkdirs_in(&rs, "checkpoint", at(root, "ck/job"), &d), ZB_OK);
  CHECK_EQ(zb_file_write_atomic("x", at(root, "ck/job/plain"), "hi", 2, &d), ZB_OK);
  zb_file_writer w;
  CHECK_EQ(zb_file_begin_in(&w, &rs, "checkpoint", at(root, "ck/job/r0.ckpt"), &d), ZB_OK);
  zb_file_write(&w, "abc", 3);
  CHECK_EQ(zb_file_commit(&w, &d), ZB_OK);
  CHECK_EQ(zb_roots_link(&rs, at(root, "ck/job/r0.ckpt"), at(root, "ck/job/r0.prev")), 0);
  CHECK_EQ(zb_roots_rename(&rs, at(root, "ck/job/r0.prev"), at(root, "ck/job/r0.old")), 0);
  CHECK_EQ(zb_roots_unlink(&rs, at(root, "ck/job/r0.old")), 0);
  zb_file_reader r;
  CHECK_EQ(zb_file_open_in(&r, &rs, "checkpoint", at(root, "ck/job/r0.ckpt"), &d), ZB_OK);
  char got[3];
  CHECK(zb_file_read(&r, got, 3) && memcmp(got, "abc", 3) == 0 && zb_file_check_end(&r));
  zb_file_close(&r);
  /* outside every root, or through '..' */
  CHECK_EQ(zb_file_begin_in(&w, &rs, "dump", at(outside, "d"), &d), ZB_ERR_IO);
  CHECK_MSG(strstr(d.msg, outside) && strstr(d.msg, "leave its --path-root"), "%s", d.msg);
  CHECK_EQ(zb_file_mkdirs_in(&rs, "dump", at(root, "../outside/x"), &d), ZB_ERR_IO);
  /* the job's directory swapped for a link to outside */
  CHECK_EQ(rename(at(root, "ck/job"), at(root, "ck/job.old")), 0);
  CHECK_EQ(symlink(outside, at(root, "ck/job")), 0);
  CHECK_EQ(zb_file_begin_in(&w, &rs, "checkpoint", at(root, "ck/job/r0.ckpt"), &d), ZB_ERR_IO);
  CHECK_MSG(strstr(d.msg, "ck/job/r0.ckpt") && strstr(d.msg, "symbolic link"), "%s", d.msg);
  CHECK_EQ(zb_file_open_in(&r, &rs, "checkpoint", at(root, "ck/job/r0.ckpt"), &d), ZB_ERR_IO);
  CHECK_EQ(zb_file_mkdirs_in(&rs, "dump", at(root, "ck/job/sub"), &d), ZB_ERR_IO);
  uint8_t *text;
  size_t len;
  CHECK_EQ(zb_file_slurp_in(&rs, "model.data", at(root, "ck/job/plain"), &text, &len, &d), ZB_ERR_IO);
  CHECK_EQ(zb_roots_link(&rs, at(root, "ck/job.old/r0.ckpt"), at(root, "ck/job/r0.ckpt")), -1);
  CHECK_EQ(errno, ELOOP);
  CHECK_EQ(zb_roots_rename(&rs, at(root, "ck/job.old/r0.ckpt"), at(root, "ck/job/r0.ckpt")), -1);
  CHECK_EQ(zb_roots_unlink(&rs, at(root, "ck/job/x")), -1);
  struct stat sb;
  CHECK_EQ(zb_roots_stat(&rs, at(root, "ck/job"), &sb), 0); /* the link itself, not followed */
  CHECK(S_ISLNK(sb.st_mode));
  CHECK_EQ(entries(outside), 0);
  /* no roots: links are followed, as without --path-root */
  CHECK_EQ(zb_file_slurp_in(NULL, "model.data", at(root, "ck/job.old/plain"), &text, &len, &d), ZB_OK);
  free(text);
  CHECK_EQ(zb_file_begin_in(&w, NULL, "checkpoint", at(root, "ck/job/r0.ckpt"), &d), ZB_OK);
  CHECK_EQ(zb_file_commit(&w, &d), ZB_OK);
  CHECK_EQ(entries(outside), 1);
  zb_roots_close(&rs);
  remove_tree();
}

/* A root named through a link above it is found by either name. */
static void test_roots_names(void) {
  make_tree();
  CHECK_EQ(symlink(root, at(base, "alias")), 0);
  zb_roots rs = {0};
  zb_diag d = {{0}};
  CHECK_EQ(zb_roots_add(&rs, at(base, "alias"), &d), ZB_OK);
  int fd;
  const char *rel;
  CHECK(zb_roots_find(&rs, at(root, "x/y"), &fd, &rel) && strcmp(rel, "x/y") == 0);
  CHECK(zb_roots_find(&rs, at(base, "alias//x"), &fd, &rel) && strcmp(rel, "x") == 0);
  CHECK(zb_roots_find(&rs, root, &fd, &rel) && strcmp(rel, "") == 0);
  CHECK(!zb_roots_find(&rs, at(base, "rootx/y"), &fd, &rel)); /* a prefix of a name is not the name */
  CHECK(!zb_roots_find(&rs, "root/x", &fd, &rel));            /* not absolute */
  CHECK(!zb_roots_find(&rs, outside, &fd, &rel));
  zb_roots_close(&rs);
  remove_tree();
}

static void test_kernel(void) {
  /* which opener zb_beneath_open used here; both ran either way */
  long fd = syscall(SYS_openat2, AT_FDCWD, "/", NULL, 0);
  printf("  openat2 on this kernel: %s\n", fd < 0 && errno == ENOSYS ? "no (walk only)" : "yes");
}

ZBT_MAIN(ZBT(test_kernel), ZBT(test_files_inside_open), ZBT(test_directory_swapped_for_a_link),
         ZBT(test_last_component_link), ZBT(test_dots_and_absolute_names), ZBT(test_mkdirs),
         ZBT(test_roots_file_operations), ZBT(test_roots_names))
