/* zb_beneath.h — opening a file beneath a directory held open, following
 * no symbolic link and never leaving that directory: what a worker's
 * --path-root confinement does at every open (docs/operations.md,
 * Security), so replacing a directory inside a root with a symbolic link
 * while a job runs cannot send the job's next file out of the root.
 *
 * rel is relative to dirfd ("" names dirfd's directory itself); empty
 * components ("a//b") are skipped. A "." or ".." component, or a leading
 * "/", is refused with EXDEV before anything is opened; a symbolic link
 * met anywhere, the last component included, is refused with ELOOP.
 * Nothing is created unless every directory on the way was reached.
 *
 * zb_beneath_open resolves with openat2(2) and RESOLVE_BENEATH |
 * RESOLVE_NO_SYMLINKS (Linux 5.6), through syscall(2) because older libcs
 * lack the wrapper; where the kernel answers ENOSYS it walks instead:
 * zb_beneath_open_walk, one openat(O_NOFOLLOW | O_DIRECTORY) per
 * component, public so tests can run the fallback on any kernel.
 *
 * Results: a new descriptor (the caller closes it), or -1 with errno.
 * dirfd stays the caller's. */
#ifndef ZB_BENEATH_H
#define ZB_BENEATH_H

#include <sys/types.h>

/* Opens rel beneath dirfd with open(2)'s flags and mode (O_CLOEXEC is
 * added). */
int zb_beneath_open(int dirfd, const char *rel, int flags, mode_t mode);
/* The fallback: the same contract, by a walk of openat(2) calls. */
int zb_beneath_open_walk(int dirfd, const char *rel, int flags, mode_t mode);

/* mkdir -p of rel beneath dirfd: mkdirat(2) of each missing component on
 * the directory reached so far (existing ones are kept), then on to it
 * with zb_beneath_open, so a component that is a symbolic link is ELOOP.
 * 0, or -1 with errno. */
int zb_beneath_mkdirs(int dirfd, const char *rel, mode_t mode);

/* errno as a message of these functions: ELOOP and EXDEV get sentences
 * that say what confinement refused; other values strerror's. */
const char *zb_beneath_strerror(int err);

#endif
