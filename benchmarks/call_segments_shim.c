// LD_PRELOAD shim of benchmarks/call_segments.py: timestamps (CLOCK_MONOTONIC,
// the clock of Python's time.monotonic_ns) of the syscalls that mark a call's
// steps, by thread, kept in memory and written to $SEGMENTS_OUT.<pid> at exit:
//   1 sendmsg that sent bytes (torchrpc's transport sends frames with it), as it began
//   2 read of a socket that returned bytes
//   3 return from pthread_cond_wait (a sleeping thread woke)
//   4 return from a blocking epoll_wait with events (an I/O thread woke)
// Without $SEGMENTS_OUT it records nothing.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  long long ns;
  int tid;
  int kind;
} Event;

#define CAPACITY (1 << 21)
static Event events[CAPACITY];
static atomic_long used;
static int enabled = -1;
static __thread int thisTid;

static int on(void) {
  if (enabled < 0) enabled = getenv("SEGMENTS_OUT") != NULL;
  return enabled;
}

static long long now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void recordAt(long long ns, int kind) {
  if (!thisTid) thisTid = (int)syscall(SYS_gettid);
  long i = atomic_fetch_add(&used, 1);
  if (i < CAPACITY) events[i] = (Event){ns, thisTid, kind};
}

static void record(int kind) {
  if (on()) recordAt(now(), kind);
}

// The next definition of `name` (libc's), looked up once; versioned where
// libc keeps old versions of it.
#define REAL(name, lookup) \
  static __typeof__(name)* real_##name = NULL; \
  if (!real_##name) real_##name = (__typeof__(name)*)(lookup)
#define NEXT(name) dlsym(RTLD_NEXT, #name)
#define NEXT_V(name) dlvsym(RTLD_NEXT, #name, "GLIBC_2.3.2")

ssize_t sendmsg(int fd, const struct msghdr* m, int flags) {
  REAL(sendmsg, NEXT(sendmsg));
  // Stamped as it starts: the peer, woken by it, may read the bytes before it returns.
  const long long start = on() ? now() : 0;
  ssize_t r = real_sendmsg(fd, m, flags);
  if (r > 0 && start) recordAt(start, 1);
  return r;
}

ssize_t read(int fd, void* buf, size_t n) {
  REAL(read, NEXT(read));
  ssize_t r = real_read(fd, buf, n);
  struct stat st;
  if (r > 0 && on() && fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) record(2);
  return r;
}

int pthread_cond_wait(pthread_cond_t* c, pthread_mutex_t* m) {
  REAL(pthread_cond_wait, NEXT_V(pthread_cond_wait));
  int r = real_pthread_cond_wait(c, m);
  record(3);
  return r;
}

int epoll_wait(int fd, struct epoll_event* ev, int n, int timeout) {
  REAL(epoll_wait, NEXT(epoll_wait));
  int r = real_epoll_wait(fd, ev, n, timeout);
  if (r > 0 && timeout != 0) record(4);
  return r;
}

__attribute__((destructor)) static void dump(void) {
  if (!on()) return;
  char path[512];
  snprintf(path, sizeof path, "%s.%d", getenv("SEGMENTS_OUT"), (int)getpid());
  FILE* f = fopen(path, "w");
  if (!f) return;
  long n = atomic_load(&used);
  if (n > CAPACITY) n = CAPACITY;
  for (long i = 0; i < n; ++i) fprintf(f, "%lld %d %d\n", events[i].ns, events[i].tid, events[i].kind);
  fclose(f);
}
