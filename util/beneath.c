/* beneath.c — see zb_beneath.h. */
#define _GNU_SOURCE /* O_PATH, syscall */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "zb_beneath.h"

#if defined(__has_include)
#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#define ZB_HAVE_OPENAT2_H 1
#endif
#endif
#ifndef ZB_HAVE_OPENAT2_H /* headers older than Linux 5.6: the ABI is fixed */
struct open_how {
  uint64_t flags, mode, resolve;
};
#define RESOLVE_NO_SYMLINKS 0x04
#define RESOLVE_BENEATH 0x08
#endif
#ifndef SYS_openat2
#define SYS_openat2 437 /* the same number on every architecture */
#endif

/* Set once the kernel said ENOSYS: every later open walks. */
static atomic_bool no_openat2;

/* False for an absolute rel or one with a "." or ".." component. */
static bool rel_confined(const char *rel) {
  if (rel[0] == '/')
    return false;
  for (const char *p = rel; *p;) {
    size_t n = strcspn(p, "/");
    if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
      return false;
    p += n;
    while (*p == '/')
      p++;
  }
  return true;
}

/* O_NOFOLLOW | O_DIRECTORY on a symbolic link says ENOTDIR; it is ELOOP
 * here, so every refused link reads the same. Keeps errno otherwise. */
static void loop_if_link(int dirfd, const char *name) {
  int saved = errno;
  struct stat sb;
  if (saved == ENOTDIR && fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(sb.st_mode))
    saved = ELOOP;
  errno = saved;
}

int zb_beneath_open_walk(int dirfd, const char *rel, int flags, mode_t mode) {
  if (!rel_confined(rel)) {
    errno = EXDEV;
    return -1;
  }
  char comp[NAME_MAX + 1];
  int cur = dirfd; /* the caller's until the first step */
  for (const char *p = rel;;) {
    size_t n = strcspn(p, "/");
    const char *next = p + n;
    while (*next == '/')
      next++;
    bool last = *next == 0;
    int fd = -1;
    if (n > NAME_MAX) {
      errno = ENAMETOOLONG;
    } else {
      memcpy(comp, n ? p : ".", n ? n : 1); /* rel "" is dirfd itself */
      comp[n ? n : 1] = 0;
      /* directories on the way only need search permission: O_PATH */
      fd = last ? openat(cur, comp, flags | O_NOFOLLOW | O_CLOEXEC, mode)
                : openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0)
        loop_if_link(cur, comp);
    }
    if (cur != dirfd) {
      int saved = errno;
      close(cur);
      errno = saved;
    }
    if (fd < 0 || last)
      return fd;
    cur = fd;
    p = next;
  }
}

static int open_how2(int dirfd, const char *rel, int flags, mode_t mode) {
  bool creates = (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
  struct open_how how = {.flags = (uint64_t)(unsigned)(flags | O_CLOEXEC),
                         .mode = creates ? mode : 0, /* openat2 refuses a mode it would not use */
                         .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS};
  for (int tries = 0;; tries++) {
    long fd = syscall(SYS_openat2, dirfd, rel[0] ? rel : ".", &how, sizeof how);
    /* EAGAIN: a rename raced the resolution; the kernel asks to retry */
    if (fd >= 0 || (errno != EAGAIN && errno != EINTR) || tries == 16)
      return (int)fd;
  }
}

int zb_beneath_open(int dirfd, const char *rel, int flags, mode_t mode) {
  if (!rel_confined(rel)) {
    errno = EXDEV;
    return -1;
  }
  if (!atomic_load(&no_openat2)) {
    int fd = open_how2(dirfd, rel, flags, mode);
    if (fd >= 0 || errno != ENOSYS)
      return fd;
    atomic_store(&no_openat2, true);
  }
  return zb_beneath_open_walk(dirfd, rel, flags, mode);
}

int zb_beneath_mkdirs(int dirfd, const char *rel, mode_t mode) {
  if (!rel_confined(rel)) {
    errno = EXDEV;
    return -1;
  }
  char comp[NAME_MAX + 1];
  int cur = dirfd, rc = 0; /* cur: the caller's until the first step */
  for (const char *p = rel; rc == 0;) {
    while (*p == '/')
      p++;
    size_t n = strcspn(p, "/");
    if (n == 0)
      break;
    int next = -1;
    if (n > NAME_MAX) {
      errno = ENAMETOOLONG;
    } else {
      memcpy(comp, p, n);
      comp[n] = 0;
      /* EEXIST: there already, a directory or not; the open tells */
      if (mkdirat(cur, comp, mode) == 0 || errno == EEXIST)
        next = zb_beneath_open(cur, comp, O_PATH | O_DIRECTORY, 0);
    }
    int saved = errno;
    if (cur != dirfd)
      close(cur);
    errno = saved;
    cur = next;
    rc = next < 0 ? -1 : 0;
    p += n;
  }
  if (cur >= 0 && cur != dirfd)
    close(cur);
  return rc;
}

const char *zb_beneath_strerror(int err) {
  if (err == ELOOP)
    return "a symbolic link is in the way (none is followed beneath a --path-root)";
  if (err == EXDEV)
    return "it would leave its --path-root ('.', '..' and absolute names are refused)";
  return strerror(err);
}
