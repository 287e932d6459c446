/* Waits on files that another thread ends: epoll_wait over a pipe and an
 * eventfd, poll, select, a plain read of a pipe and of an eventfd, a write
 * to a full pipe and a read that a close ends; edge- against
 * level-triggered epoll; timeouts; and (64-bit) a SIGALRM that ends an
 * epoll_wait with EINTR, one that a ppoll's own mask holds off until it
 * returns, and an SA_RESTART one after which a pipe read goes on. The main thread tells a worker which
 * step it is at (an EFD_SEMAPHORE eventfd the worker blocks on); the worker
 * naps 30 ms, so the main thread is waiting by then, and makes the step's
 * file ready. Every line is deterministic. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/select.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int data[2]; /* the pipe the main thread reads */
static int efd;     /* the eventfd the main thread reads */
static int go;      /* main -> worker: the next step begins */
static long drained; /* what the worker read from the full pipe */

static void nap(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void step(void) {
    uint64_t one = 1;
    if (write(go, &one, 8) != 8)
        perror("step");
}

static void put(const char *s) {
    if (write(data[1], s, strlen(s)) != (ssize_t)strlen(s))
        perror("put");
}

static void add(uint64_t v) {
    if (write(efd, &v, 8) != 8)
        perror("add");
}

static void *worker(void *arg) {
    (void)arg;
    static char sink[16384];
    for (int k = 0;; k++) {
        uint64_t v;
        if (read(go, &v, 8) != 8) {
            perror("worker read");
            return NULL;
        }
        nap(30);
        switch (k) {
        case 0: add(5); break;
        case 1: put("p1"); break;
        case 2: put("p2"); break;
        case 3: put("hello"); break;
        case 4: add(7); break;
        case 5: put("s"); break;
        case 6: drained = read(data[0], sink, sizeof sink); break;
        case 7: close(data[1]); return NULL;
        }
    }
}

static void show_events(const char *what, int n, struct epoll_event *ev) {
    printf("%s: %d", what, n);
    for (int i = 0; i < n; i++)
        printf(" [events=%#x data=%llu]", ev[i].events, (unsigned long long)ev[i].data.u64);
    printf("\n");
}

static int ep_add(int ep, int fd, uint32_t events, uint64_t d) {
    struct epoll_event e = {.events = events, .data.u64 = d};
    return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
}

static void triggering(void) {
    int p[2];
    char b[8];
    struct epoll_event ev[4];
    if (pipe(p))
        perror("pipe");
    int lt = epoll_create1(EPOLL_CLOEXEC), et = epoll_create1(0);
    ep_add(lt, p[0], EPOLLIN, 1);
    ep_add(et, p[0], EPOLLIN | EPOLLET, 2);
    if (write(p[1], "abc", 3) != 3)
        perror("write");
    int a = epoll_wait(lt, ev, 4, 0), b2 = epoll_wait(lt, ev, 4, 0);
    printf("level: %d then %d\n", a, b2);
    a = epoll_wait(et, ev, 4, 0);
    b2 = epoll_wait(et, ev, 4, 0);
    printf("edge: %d then %d\n", a, b2);
    if (write(p[1], "d", 1) != 1)
        perror("write");
    printf("edge after a write: %d\n", epoll_wait(et, ev, 4, 0));
    if (read(p[0], b, sizeof b) != 4)
        perror("read");
    /* One-shot: once, then nothing until EPOLL_CTL_MOD. */
    struct epoll_event e = {.events = EPOLLIN | EPOLLONESHOT, .data.u64 = 3};
    epoll_ctl(lt, EPOLL_CTL_MOD, p[0], &e);
    if (write(p[1], "e", 1) != 1)
        perror("write");
    a = epoll_wait(lt, ev, 4, 0);
    b2 = epoll_wait(lt, ev, 4, 0);
    epoll_ctl(lt, EPOLL_CTL_MOD, p[0], &e);
    printf("oneshot: %d then %d, after mod %d\n", a, b2, epoll_wait(lt, ev, 4, 0));
    /* The errors. */
    printf("add again: %s\n", ep_add(lt, p[0], EPOLLIN, 0) ? strerror(errno) : "ok");
    printf("add itself: %s\n", ep_add(lt, lt, EPOLLIN, 0) ? strerror(errno) : "ok");
    printf("del unknown: %s\n", epoll_ctl(lt, EPOLL_CTL_DEL, p[1], NULL) ? strerror(errno) : "ok");
    printf("wait on a pipe: %s\n", epoll_wait(p[0], ev, 4, 0) < 0 ? strerror(errno) : "ok");
    /* Closing the only reference drops the watch. */
    close(p[0]);
    printf("after close: %d\n", epoll_wait(lt, ev, 4, 0));
    close(p[1]);
    close(lt);
    close(et);
}

static void timeouts(void) {
    int p[2];
    struct epoll_event ev[2];
    if (pipe(p))
        perror("pipe");
    int ep = epoll_create1(0);
    ep_add(ep, p[0], EPOLLIN, 9);
    double t0 = now_ms();
    int e = epoll_wait(ep, ev, 2, 40);
    double t1 = now_ms();
    struct pollfd pf = {.fd = p[0], .events = POLLIN};
    int po = poll(&pf, 1, 40);
    double t2 = now_ms();
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(p[0], &rs);
    struct timeval tv = {0, 40000};
    int se = select(p[0] + 1, &rs, NULL, NULL, &tv);
    double t3 = now_ms();
    printf("timeouts: epoll %d poll %d select %d, waited %s\n", e, po, se,
           t1 - t0 >= 35 && t2 - t1 >= 35 && t3 - t2 >= 35 ? "yes" : "no");
    close(ep);
    close(p[0]);
    close(p[1]);
}

#ifdef __x86_64__
static volatile sig_atomic_t alarms;

static void on_alarm(int sig) {
    (void)sig;
    alarms++;
}

static int restart_pipe[2];

static void on_alarm_write(int sig) {
    (void)sig;
    if (write(restart_pipe[1], "r", 1) != 1)
        alarms = -100;
}

static void interrupted(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; /* no SA_RESTART */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    int ep = epoll_create1(0);
    struct epoll_event ev;
    struct itimerval it = {{0, 0}, {0, 20000}};
    setitimer(ITIMER_REAL, &it, NULL);
    int r = epoll_wait(ep, &ev, 1, -1);
    printf("epoll_wait and SIGALRM: %d (%s), handler ran %d\n", r,
           r < 0 ? strerror(errno) : "no error", (int)alarms);
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGALRM);
    setitimer(ITIMER_REAL, &it, NULL);
    struct timespec ts = {0, 60000000};
    r = ppoll(NULL, 0, &ts, &block);
    printf("ppoll with SIGALRM blocked: %d, then the handler ran: %d\n", r, (int)alarms);
    close(ep);

    /* An SA_RESTART handler: the read it interrupted is made again, and
     * gets what the handler wrote. */
    if (pipe(restart_pipe))
        perror("pipe");
    sa.sa_handler = on_alarm_write;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    setitimer(ITIMER_REAL, &it, NULL);
    char c = 0;
    ssize_t n = read(restart_pipe[0], &c, 1);
    printf("read under an SA_RESTART handler: %ld %c\n", (long)n, n == 1 ? c : '-');
    close(restart_pipe[0]);
    close(restart_pipe[1]);
}
#endif

int main(void) {
    char buf[64];
    struct epoll_event ev[8];
    uint64_t v;
    setvbuf(stdout, NULL, _IOLBF, 0);
#ifdef __x86_64__
    interrupted();
#endif
    triggering();
    timeouts();
    if (pipe(data))
        perror("pipe");
    efd = eventfd(0, EFD_CLOEXEC);
    go = eventfd(0, EFD_SEMAPHORE);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    ep_add(ep, data[0], EPOLLIN, 100);
    ep_add(ep, efd, EPOLLIN, 200);
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);

    step(); /* 0: the eventfd, through epoll without a timeout */
    show_events("epoll eventfd", epoll_wait(ep, ev, 8, -1), ev);
    if (read(efd, &v, 8) == 8)
        printf("eventfd read: %llu\n", (unsigned long long)v);

    step(); /* 1: the pipe, through epoll with a long timeout */
    show_events("epoll pipe", epoll_wait(ep, ev, 8, 10000), ev);
    ssize_t n = read(data[0], buf, sizeof buf);
    printf("pipe read: %.*s\n", (int)n, buf);

    step(); /* 2: poll */
    struct pollfd pf = {.fd = data[0], .events = POLLIN};
    int r = poll(&pf, 1, -1);
    printf("poll: %d revents=%#x\n", r, pf.revents);
    n = read(data[0], buf, sizeof buf);
    printf("pipe read: %.*s\n", (int)n, buf);

    step(); /* 3: a plain read of the pipe */
    n = read(data[0], buf, sizeof buf);
    printf("blocking pipe read: %.*s\n", (int)n, buf);

    step(); /* 4: a plain read of the eventfd */
    if (read(efd, &v, 8) == 8)
        printf("blocking eventfd read: %llu\n", (unsigned long long)v);

    step(); /* 5: select */
    fd_set rs;
    FD_ZERO(&rs);
    FD_SET(data[0], &rs);
    r = select(data[0] + 1, &rs, NULL, NULL, NULL);
    printf("select: %d readable=%d\n", r, FD_ISSET(data[0], &rs) ? 1 : 0);
    n = read(data[0], buf, sizeof buf);
    printf("pipe read: %.*s\n", (int)n, buf);

    /* 6: a write to a full pipe waits until the worker reads. */
    fcntl(data[1], F_SETFL, O_NONBLOCK);
    static char fill[4096];
    long full = 0;
    while ((n = write(data[1], fill, sizeof fill)) > 0)
        full += n;
    printf("pipe full at %ld (%s)\n", full, strerror(errno));
    fcntl(data[1], F_SETFL, 0);
    step();
    n = write(data[1], fill, sizeof fill);
    printf("blocked write: %ld\n", (long)n);
    long left = 0;
    fcntl(data[0], F_SETFL, O_NONBLOCK);
    static char sink[8192];
    while ((n = read(data[0], sink, sizeof sink)) > 0)
        left += n;
    fcntl(data[0], F_SETFL, 0);
    printf("left in the pipe: %ld\n", left);

    step(); /* 7: the worker closes the write end: end of file */
    n = read(data[0], buf, sizeof buf);
    printf("read after the close: %ld\n", (long)n);
    show_events("epoll after the close", epoll_wait(ep, ev, 8, 0), ev);
    pthread_join(t, NULL);
    printf("worker drained %ld\n", drained);
    printf("poll done\n");
    return 0;
}
