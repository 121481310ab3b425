/* nccl_fork.h — runs a test's ranks as forked processes (test-only): rank
 * 0 makes the NCCL id and hands it to the others through pipes, standing
 * in for the coordinator (docs/model.md, Transports). Each rank's function
 * returns its exit status (0: passed). The parent kills every rank still
 * running after the deadline. Single-threaded parent; no shared state:
 * ids a test needs beyond rank 0's (a stage group's) come from
 * nf_ids_root, a child of their own, never from the parent, which must
 * start no thread before it forks (a rank forked while another thread
 * held a lock hung under ASan).
 */
#ifndef ZB_NCCL_FORK_H
#define ZB_NCCL_FORK_H

#include <nccl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NF_MAX 8

typedef int (*nf_rank_fn)(int rank, int n, const ncclUniqueId *id);

/* In a rank's function (a variable `rank` in scope): fails the rank, exit
 * status 1, with the condition and a printf-style message. */
#define RCHECK(cond, ...)                                                                                    \
  do {                                                                                                       \
    if (!(cond)) {                                                                                           \
      fprintf(stderr, "%s:%d: rank %d: check failed: %s: ", __FILE__, __LINE__, rank, #cond);                \
      fprintf(stderr, __VA_ARGS__);                                                                          \
      fprintf(stderr, "\n");                                                                                 \
      return 1;                                                                                              \
    }                                                                                                        \
  } while (0)

static inline double nf_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void nf_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static inline int nf_child(int rank, int n, int fds[NF_MAX][2], nf_rank_fn fn) {
  ncclUniqueId id;
  if (rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) {
      fprintf(stderr, "rank 0: ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
      return 2;
    }
    for (int q = 1; q < n; q++)
      if (write(fds[q][1], &id, sizeof id) != (ssize_t)sizeof id)
        return 2;
  } else if (read(fds[rank][0], &id, sizeof id) != (ssize_t)sizeof id) {
    fprintf(stderr, "rank %d: no id from rank 0\n", rank);
    return 2;
  }
  return fn(rank, n, &id);
}

/* Makes n NCCL ids into ids in a child process of their own, which stays
 * alive as their rendezvous root (a thread there, as NCCL's bootstrap
 * root is) until nf_ids_root_end. Returns its pid, or -1. */
static inline pid_t nf_ids_root(int n, ncclUniqueId *ids) {
  int fd[2];
  if (pipe(fd) != 0)
    return -1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    for (int r = 0; r < n; r++)
      if (ncclGetUniqueId(&ids[r]) != ncclSuccess) {
        fprintf(stderr, "ids root: ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
        _exit(1);
      }
    bool sent = write(fd[1], ids, sizeof *ids * (size_t)n) == (ssize_t)(sizeof *ids * (size_t)n);
    close(fd[1]);
    while (sent)
      pause();
    _exit(1);
  }
  close(fd[1]);
  size_t got = 0, want = sizeof *ids * (size_t)n;
  while (pid > 0 && got < want) {
    ssize_t k = read(fd[0], (char *)ids + got, want - got);
    if (k <= 0)
      break;
    got += (size_t)k;
  }
  close(fd[0]);
  if (pid > 0 && got < want) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
  }
  return pid;
}

static inline void nf_ids_root_end(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* Runs fn as n ranks; status[q] is waitpid's status of rank q (-1: killed
 * at the deadline). Returns how many ranks did not exit 0. */
static inline int nf_run(int n, nf_rank_fn fn, double deadline_s, int status[NF_MAX]) {
  int fds[NF_MAX][2];
  pid_t pid[NF_MAX];
  for (int q = 0; q < n; q++)
    if (pipe(fds[q]) != 0)
      return n;
  fflush(NULL);
  for (int q = 0; q < n; q++) {
    pid[q] = fork();
    if (pid[q] == 0)
      _exit(nf_child(q, n, fds, fn));
  }
  for (int q = 0; q < n; q++) {
    close(fds[q][0]);
    close(fds[q][1]);
  }
  int bad = 0, left = n;
  double end = nf_now() + deadline_s;
  bool done[NF_MAX] = {false};
  while (left > 0) {
    for (int q = 0; q < n; q++)
      if (!done[q] && waitpid(pid[q], &status[q], WNOHANG) == pid[q]) {
        done[q] = true;
        left--;
        bad += !(WIFEXITED(status[q]) && WEXITSTATUS(status[q]) == 0);
      }
    if (left > 0 && nf_now() > end) {
      for (int q = 0; q < n; q++)
        if (!done[q]) {
          fprintf(stderr, "rank %d still running at the deadline: killed\n", q);
          kill(pid[q], SIGKILL);
          waitpid(pid[q], NULL, 0);
          status[q] = -1;
          done[q] = true;
          bad++;
        }
      left = 0;
    }
    nf_sleep_ms(5);
  }
  return bad;
}

#endif
