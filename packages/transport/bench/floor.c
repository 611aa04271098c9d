// Floor for request/reply over loopback: blocking read/write in C, client and server in two
// processes (fork), u32 little-endian length prefix (CONTRACT 2-3), 16 KiB reply. Prints JSON lines of p50/p99 in us.
// Build and run (optional, not part of `pnpm bench`):
//   cc -O2 -o /tmp/floor bench/floor.c && /tmp/floor tcp && /tmp/floor unix
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define REPLY 16384
static const size_t SIZES[] = {64, 96 * 1024, 768 * 1024, 4 * 1024 * 1024};
static const int ITERS[] = {3000, 1000, 300, 100};

// The stream prefix is little-endian on the wire whatever the host order (CONTRACT 3).
static void put_le32(void *p, uint32_t v) {
  unsigned char *b = p;
  b[0] = (unsigned char)v, b[1] = (unsigned char)(v >> 8), b[2] = (unsigned char)(v >> 16),
  b[3] = (unsigned char)(v >> 24);
}
static uint32_t get_le32(const void *p) {
  const unsigned char *b = p;
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static int readn(int fd, void *b, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = read(fd, (char *)b + got, n - got);
    if (k <= 0) return -1;
    got += (size_t)k;
  }
  return 0;
}
static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int unixsock = argc > 1 && strcmp(argv[1], "unix") == 0;
  int ls;
  struct sockaddr_in in = {0};
  struct sockaddr_un un = {0};
  socklen_t alen;
  if (unixsock) {
    ls = socket(AF_UNIX, SOCK_STREAM, 0);
    un.sun_family = AF_UNIX;
    snprintf(un.sun_path, sizeof un.sun_path, "/tmp/floor-%d.sock", getpid());
    unlink(un.sun_path);
    bind(ls, (struct sockaddr *)&un, sizeof un);
  } else {
    ls = socket(AF_INET, SOCK_STREAM, 0);
    in.sin_family = AF_INET;
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(ls, (struct sockaddr *)&in, sizeof in);
    alen = sizeof in;
    getsockname(ls, (struct sockaddr *)&in, &alen);
  }
  listen(ls, 1);
  char *buf = malloc(8 << 20), reply[REPLY + 4];
  memset(reply, 7, sizeof reply);
  put_le32(reply, REPLY);
  if (fork() == 0) {
    int s = accept(ls, NULL, NULL), one = 1;
    if (!unixsock) setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    for (;;) {
      unsigned char h[4];
      if (readn(s, h, 4) < 0) exit(0);
      if (readn(s, buf, get_le32(h)) < 0) exit(0);
      if (write(s, reply, sizeof reply) != (ssize_t)sizeof reply) exit(1);
    }
  }
  int c, one = 1;
  if (unixsock) {
    c = socket(AF_UNIX, SOCK_STREAM, 0);
    connect(c, (struct sockaddr *)&un, sizeof un);
  } else {
    c = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    connect(c, (struct sockaddr *)&in, sizeof in);
  }
  char *msg = malloc(8 << 20), rbuf[REPLY];
  memset(msg, 1, 8 << 20);
  for (int si = 0; si < 4; si++) {
    size_t size = SIZES[si];
    int n = ITERS[si];
    double *lat = malloc(sizeof(double) * n);
    for (int i = -n / 10; i < n; i++) {
      unsigned char h[4], rh[4];
      put_le32(h, (uint32_t)size);
      struct iovec iov[2] = {{h, 4}, {msg, size}};
      double a = now_us();
      size_t left = 4 + size;
      int idx = 0;
      while (left > 0) {  // writev until all is out
        ssize_t k = writev(c, iov + idx, 2 - idx);
        if (k < 0) return 1;
        left -= (size_t)k;
        while (idx < 2 && (size_t)k >= iov[idx].iov_len) k -= iov[idx++].iov_len;
        if (idx < 2) { iov[idx].iov_base = (char *)iov[idx].iov_base + k; iov[idx].iov_len -= k; }
      }
      if (readn(c, rh, 4) < 0 || readn(c, rbuf, get_le32(rh)) < 0) return 1;
      if (i >= 0) lat[i] = now_us() - a;
    }
    qsort(lat, n, sizeof(double), cmp);
    printf("{\"carrier\":\"%s\",\"requestBytes\":%zu,\"p50_us\":%.1f,\"p99_us\":%.1f}\n",
           unixsock ? "unix" : "tcp", size, lat[n / 2], lat[n * 99 / 100]);
    free(lat);
  }
  close(c);
  wait(NULL);
  if (unixsock) unlink(un.sun_path);
  return 0;
}
