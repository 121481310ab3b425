/* zb_file.h — zb's one file module: whole-file reads, mkdir -p, and files
 * written atomically. The checked files (checkpoints, gradient dumps) use
 * a writer that folds every byte into an FNV-1a checksum and publishes the
 * file only once it is complete and on disk, and a reader that verifies
 * the same checksum; zb_file_write_atomic publishes plain bytes the same
 * way (the coordinator's port file, zbctl's output files).
 *
 * A writer puts the bytes in PATH.tmp.PID in the same directory; commit
 * appends the checksum (uint64, native order) of every byte before it,
 * fsyncs, renames over PATH and fsyncs the directory, so a crash at any
 * point leaves the old file or the new one, never a mixture.
 *
 * The _in variants take a root set (zb_roots.h): with roots on, every
 * file, temporary file and directory is opened, created, renamed and
 * removed beneath the root its path names, following no symbolic link
 * (a worker's --path-root, docs/operations.md, Security); NULL or an
 * empty set is the plain variant. A writer reaches its directory once, at
 * begin, and creates, renames and fsyncs through that descriptor.
 *
 * Ownership: writer and reader are caller-owned structs; commit or abort
 * ends a writer, zb_file_close a reader. The roots are borrowed for the
 * call. Nothing else is kept.
 * Results: zb_err from lib/zb_err.h; ZB_ERR_IO names the file and the
 * system's reason. `what` ("checkpoint", "dump") starts every message.
 */
#ifndef ZB_FILE_H
#define ZB_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "zb_err.h"
#include "zb_roots.h"

typedef struct zb_file_writer {
  int fd;
  int dirfd;      /* the directory path is in, from begin to commit or abort */
  size_t leaf_at; /* where path's (and tmp's) last component starts */
  bool confined;  /* beneath a root: the temporary file follows no link either */
  bool failed;    /* a write failed; commit reports it */
  bool plain;     /* no checksum trailer (zb_file_write_atomic) */
  int saved_errno;
  uint64_t sum;
  const char *what; /* borrowed: a string literal */
  char path[1024], tmp[1100];
} zb_file_writer;

/* Opens a writer for path (its directory must exist). */
zb_err zb_file_begin(zb_file_writer *w, const char *what, const char *path, zb_diag *diag);
zb_err zb_file_begin_in(zb_file_writer *w, const zb_roots *roots, const char *what, const char *path,
                        zb_diag *diag);
/* Appends n bytes; a failure is remembered and reported by commit. */
void zb_file_write(zb_file_writer *w, const void *p, size_t n);
/* Appends the checksum and publishes the file (see above); on failure the
 * temporary file is removed and path is untouched. Ends the writer. */
zb_err zb_file_commit(zb_file_writer *w, zb_diag *diag);
/* Drops the temporary file. Ends the writer. */
void zb_file_abort(zb_file_writer *w);

typedef struct zb_file_reader {
  FILE *f;
  uint64_t sum;
} zb_file_reader;

/* Opens path for reading. */
zb_err zb_file_open(zb_file_reader *r, const char *what, const char *path, zb_diag *diag);
zb_err zb_file_open_in(zb_file_reader *r, const zb_roots *roots, const char *what, const char *path,
                       zb_diag *diag);
/* Reads exactly n bytes into p and folds them into the checksum; false at
 * a short read. */
bool zb_file_read(zb_file_reader *r, void *p, size_t n);
/* Reads the trailing checksum: true when it matches every byte read so
 * far and nothing follows it. */
bool zb_file_check_end(zb_file_reader *r);
void zb_file_close(zb_file_reader *r);

/* Reads the whole file at path ("-": standard input) into an allocated
 * buffer (*out, *len; the caller frees *out), NUL-terminated past *len so
 * text can be read as a string. Messages start with `what` ("model.data"). */
zb_err zb_file_slurp(const char *what, const char *path, uint8_t **out, size_t *len, zb_diag *diag);
zb_err zb_file_slurp_in(const zb_roots *roots, const char *what, const char *path, uint8_t **out, size_t *len,
                        zb_diag *diag);

/* Writes len bytes as the file at path, atomically (PATH.tmp.PID, fsync,
 * rename, directory fsync): readers see the old file or the whole new one. */
zb_err zb_file_write_atomic(const char *what, const char *path, const void *data, size_t len, zb_diag *diag);
/* The same beneath roots (zb_roots.h; NULL: the path as it is). */
zb_err zb_file_write_atomic_in(const zb_roots *roots, const char *what, const char *path, const void *data,
                               size_t len, zb_diag *diag);

/* Creates dir and its missing parents (mkdir -p), mode 0755. */
zb_err zb_file_mkdirs(const char *what, const char *dir, zb_diag *diag);
zb_err zb_file_mkdirs_in(const zb_roots *roots, const char *what, const char *dir, zb_diag *diag);

#endif
