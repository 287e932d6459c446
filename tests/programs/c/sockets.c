/* Sockets as Linux has them, over 127.0.0.1 inside one process: TCP and
 * UDP, blocking and non-blocking, errors, socket options, shutdown, resets
 * and SIGPIPE, poll/ppoll/select/pselect and level-, edge-triggered and
 * one-shot epoll on sockets, an eventfd beside sockets in one epoll set,
 * a 1 MiB transfer through a pair with small buffers, and waits that a
 * helper thread ends (a blocking recv, accept, MSG_WAITALL, a send into a
 * full buffer). On i386 the raw calls go both through the socketcall
 * multiplexer and through the direct system calls; 64-bit builds make the
 * direct calls; all print the same line.
 *
 * Every line is deterministic: ports are bound as 0 and only compared (equal
 * yes/no, nonzero yes/no), buffer sizes are only compared with what was
 * set, errors are printed by name (the C libraries' strerror texts differ),
 * and anything that arrives over loopback is waited for with a timeout
 * before it is looked at. One line per check; the last is `sockets done`. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define LOOP htonl(INADDR_LOOPBACK)

static const char *ename(int e) {
    switch (e) {
    case 0: return "0";
    case EPERM: return "EPERM";
    case ENOENT: return "ENOENT";
    case EINTR: return "EINTR";
    case EBADF: return "EBADF";
    case EAGAIN: return "EAGAIN";
    case EACCES: return "EACCES";
    case EFAULT: return "EFAULT";
    case EEXIST: return "EEXIST";
    case EINVAL: return "EINVAL";
    case EMFILE: return "EMFILE";
    case ESPIPE: return "ESPIPE";
    case EPIPE: return "EPIPE";
    case ENOSYS: return "ENOSYS";
    case ENOTSOCK: return "ENOTSOCK";
    case EDESTADDRREQ: return "EDESTADDRREQ";
    case EMSGSIZE: return "EMSGSIZE";
    case EPROTOTYPE: return "EPROTOTYPE";
    case ENOPROTOOPT: return "ENOPROTOOPT";
    case EPROTONOSUPPORT: return "EPROTONOSUPPORT";
    case ESOCKTNOSUPPORT: return "ESOCKTNOSUPPORT";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case EAFNOSUPPORT: return "EAFNOSUPPORT";
    case EADDRINUSE: return "EADDRINUSE";
    case EADDRNOTAVAIL: return "EADDRNOTAVAIL";
    case ENETUNREACH: return "ENETUNREACH";
    case ECONNABORTED: return "ECONNABORTED";
    case ECONNRESET: return "ECONNRESET";
    case ENOBUFS: return "ENOBUFS";
    case EISCONN: return "EISCONN";
    case ENOTCONN: return "ENOTCONN";
    case ETIMEDOUT: return "ETIMEDOUT";
    case ECONNREFUSED: return "ECONNREFUSED";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case EALREADY: return "EALREADY";
    case EINPROGRESS: return "EINPROGRESS";
    default: {
        static char buf[32];
        snprintf(buf, sizeof buf, "errno %d", e);
        return buf;
    }
    }
}

/* `WHAT: N` for a result, `WHAT: ENAME` for -1. */
static void rc(const char *what, long r) {
    if (r < 0)
        printf("%s: %s\n", what, ename(errno));
    else
        printf("%s: %ld\n", what, r);
}

/* `WHAT: ok` for 0, `WHAT: ENAME` for -1. */
static void ok(const char *what, long r) {
    if (r < 0)
        printf("%s: %s\n", what, ename(errno));
    else if (r == 0)
        printf("%s: ok\n", what);
    else
        printf("%s: %ld\n", what, r);
}

static const char *yesno(int b) { return b ? "yes" : "no"; }

/* poll/epoll event bits by name, in a fixed order. */
static const char *evs(unsigned ev) {
    static char bufs[4][64];
    static int next;
    char *buf = bufs[next++ % 4];
    static const struct { unsigned bit; const char *name; } names[] = {
        {POLLIN, "IN"},     {POLLPRI, "PRI"},     {POLLOUT, "OUT"},
        {POLLERR, "ERR"},   {POLLHUP, "HUP"},     {POLLRDHUP, "RDHUP"},
        {POLLNVAL, "NVAL"},
    };
    buf[0] = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (ev & names[i].bit) {
            if (buf[0])
                strcat(buf, "|");
            strcat(buf, names[i].name);
        }
    if (!buf[0])
        strcpy(buf, "0");
    return buf;
}

/* POLL* bits only (drops RDNORM/WRNORM and the like). */
#define SHOWN (POLLIN | POLLPRI | POLLOUT | POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)

static void nap(int ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Polls fd for `ask` until every bit of `want` is there or about `ms`
 * milliseconds pass; the last revents (POLL* bits only). */
static unsigned wait_ev(int fd, short ask, short want, int ms) {
    struct pollfd p = {fd, ask, 0};
    for (int waited = 0;; waited += 10) {
        p.revents = 0;
        int n = poll(&p, 1, 10);
        if (n == 1 && (p.revents & want) == want)
            break;
        if (waited >= ms)
            break;
    }
    return (unsigned)p.revents & SHOWN;
}

static struct sockaddr_in sin_of(uint32_t addr, uint16_t port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = addr;
    a.sin_port = port;
    return a;
}

static uint16_t local_port(int fd) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        return 0;
    return a.sin_port;
}

static uint16_t peer_port(int fd) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    if (getpeername(fd, (struct sockaddr *)&a, &len) != 0)
        return 0;
    return a.sin_port;
}

static int geti(int fd, int level, int name) {
    int v = -1;
    socklen_t len = sizeof v;
    if (getsockopt(fd, level, name, &v, &len) != 0)
        return -1000 - errno;
    return v;
}

static int seti(int fd, int level, int name, int v) {
    return setsockopt(fd, level, name, &v, sizeof v);
}

static int is_nonblock(int fd) { return (fcntl(fd, F_GETFL) & O_NONBLOCK) != 0; }

static int is_cloexec(int fd) { return (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0; }

/* A listening TCP socket on 127.0.0.1 at a port the kernel picks. */
static int listener(int flags, int reuse) {
    int l = socket(AF_INET, SOCK_STREAM | flags, 0);
    struct sockaddr_in a = sin_of(LOOP, 0);
    if (reuse)
        seti(l, SOL_SOCKET, SO_REUSEADDR, 1);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 16) != 0) {
        printf("listener: %s\n", ename(errno));
        exit(1);
    }
    return l;
}

static struct sockaddr_in addr_of(int fd) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    memset(&a, 0, sizeof a);
    getsockname(fd, (struct sockaddr *)&a, &len);
    return a;
}

/* A connected TCP pair over loopback (both blocking): *c connected, *s
 * accepted. The listener is closed. */
static void tcp_pair(int *c, int *s) {
    int l = listener(0, 0);
    struct sockaddr_in a = addr_of(l);
    *c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(*c, (struct sockaddr *)&a, sizeof a) != 0) {
        printf("pair connect: %s\n", ename(errno));
        exit(1);
    }
    *s = accept(l, NULL, NULL);
    if (*s < 0) {
        printf("pair accept: %s\n", ename(errno));
        exit(1);
    }
    close(l);
}

static void put(int fd, const char *s) {
    if (send(fd, s, strlen(s), MSG_NOSIGNAL) != (ssize_t)strlen(s))
        printf("put: %s\n", ename(errno));
}

/* recv of up to n bytes once fd is readable: `WHAT: N "TEXT"`. */
static void show_recv(const char *what, int fd, size_t n, int flags) {
    char buf[256];
    wait_ev(fd, POLLIN, POLLIN, 2000);
    ssize_t r = recv(fd, buf, n < sizeof buf ? n : sizeof buf, flags);
    if (r < 0)
        printf("%s: %s\n", what, ename(errno));
    else
        printf("%s: %zd \"%.*s\"\n", what, r, (int)r, buf);
}

/* A TCP (or UDP) port that was bound a moment ago and is closed now:
 * nothing listens there (nothing is bound there), unless another process
 * took it in between. */
static uint16_t port_closed_of(int type) {
    int s = socket(AF_INET, type, 0);
    struct sockaddr_in a = sin_of(LOOP, 0);
    bind(s, (struct sockaddr *)&a, sizeof a);
    uint16_t p = local_port(s);
    close(s);
    return p;
}

static uint16_t port_closed(void) { return port_closed_of(SOCK_STREAM); }

/* ---------------------------------------------------------------- */

static void creation(void) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    printf("socket nonblock cloexec: O_NONBLOCK %s FD_CLOEXEC %s\n", yesno(is_nonblock(s)),
           yesno(is_cloexec(s)));
    int p = socket(AF_INET, SOCK_STREAM, 0);
    printf("socket plain: O_NONBLOCK %s FD_CLOEXEC %s\n", yesno(is_nonblock(p)), yesno(is_cloexec(p)));
    printf("socket access mode O_RDWR: %s\n", yesno((fcntl(p, F_GETFL) & O_ACCMODE) == O_RDWR));
    printf("SO_TYPE tcp: %s\n", geti(p, SOL_SOCKET, SO_TYPE) == SOCK_STREAM ? "SOCK_STREAM" : "?");
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    printf("SO_TYPE udp: %s\n", geti(u, SOL_SOCKET, SO_TYPE) == SOCK_DGRAM ? "SOCK_DGRAM" : "?");
    printf("SO_DOMAIN: %s\n", geti(p, SOL_SOCKET, SO_DOMAIN) == AF_INET ? "AF_INET" : "?");
    printf("SO_PROTOCOL tcp udp: %d %d\n", geti(p, SOL_SOCKET, SO_PROTOCOL),
           geti(u, SOL_SOCKET, SO_PROTOCOL));
    int t = socket(AF_INET, SOCK_STREAM, IPPROTO_TCP);
    int d = socket(AF_INET, SOCK_DGRAM, IPPROTO_UDP);
    printf("socket with IPPROTO_TCP and IPPROTO_UDP: %s %s\n", yesno(t >= 0), yesno(d >= 0));
    close(s);
    close(p);
    close(u);
    close(t);
    close(d);
}

static void binding(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    memset(&a, 0xee, sizeof a);
    getsockname(s, (struct sockaddr *)&a, &len);
    printf("getsockname unbound: family %s addr %s port %d len %u\n",
           a.sin_family == AF_INET ? "AF_INET" : "?", inet_ntoa(a.sin_addr), ntohs(a.sin_port),
           (unsigned)len);
    struct sockaddr_in want = sin_of(LOOP, 0);
    ok("bind 127.0.0.1:0", bind(s, (struct sockaddr *)&want, sizeof want));
    len = sizeof a;
    memset(&a, 0, sizeof a);
    ok("getsockname", getsockname(s, (struct sockaddr *)&a, &len));
    printf("bound: family %s addr %s port nonzero %s len %u\n",
           a.sin_family == AF_INET ? "AF_INET" : "?", inet_ntoa(a.sin_addr), yesno(a.sin_port != 0),
           (unsigned)len);
    ok("bind again", bind(s, (struct sockaddr *)&want, sizeof want));
    printf("SO_ACCEPTCONN before listen: %d\n", geti(s, SOL_SOCKET, SO_ACCEPTCONN));
    ok("listen", listen(s, 4));
    printf("SO_ACCEPTCONN after listen: %d\n", geti(s, SOL_SOCKET, SO_ACCEPTCONN));
    ok("listen again", listen(s, 8));
    int s2 = socket(AF_INET, SOCK_STREAM, 0);
    ok("bind to a port in use", bind(s2, (struct sockaddr *)&a, sizeof a));
    seti(s2, SOL_SOCKET, SO_REUSEADDR, 1);
    ok("bind to a listening port with SO_REUSEADDR", bind(s2, (struct sockaddr *)&a, sizeof a));
    close(s2);
    int any = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in wild = sin_of(htonl(INADDR_ANY), a.sin_port);
    ok("bind 0.0.0.0 to a port in use on 127.0.0.1", bind(any, (struct sockaddr *)&wild, sizeof wild));
    close(any);
    close(s);
    int s3 = socket(AF_INET, SOCK_STREAM, 0);
    ok("bind to the port of a closed listener", bind(s3, (struct sockaddr *)&a, sizeof a));
    close(s3);

    int f = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in far = sin_of(inet_addr("192.0.2.1"), 0);
    ok("bind to a non-local address", bind(f, (struct sockaddr *)&far, sizeof far));
    ok("bind with addrlen 8", bind(f, (struct sockaddr *)&want, 8));
    ok("bind with a bad address pointer", bind(f, (struct sockaddr *)8, sizeof want));
    struct sockaddr_in unix_family = want;
    unix_family.sin_family = AF_UNIX;
    ok("bind with family AF_UNIX", bind(f, (struct sockaddr *)&unix_family, sizeof unix_family));
    close(f);

    /* The port of a connection closed first on the server side is in
     * TIME_WAIT: a bind without SO_REUSEADDR fails, one with it works. */
    int l = listener(0, 1);
    struct sockaddr_in la = addr_of(l);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    connect(c, (struct sockaddr *)&la, sizeof la);
    int srv = accept(l, NULL, NULL);
    close(l);
    close(srv);
    wait_ev(c, POLLIN | POLLRDHUP, POLLRDHUP, 2000);
    close(c);
    nap(20);
    int r1 = socket(AF_INET, SOCK_STREAM, 0);
    ok("bind to a port in TIME_WAIT", bind(r1, (struct sockaddr *)&la, sizeof la));
    int r2 = socket(AF_INET, SOCK_STREAM, 0);
    seti(r2, SOL_SOCKET, SO_REUSEADDR, 1);
    ok("bind to a port in TIME_WAIT with SO_REUSEADDR", bind(r2, (struct sockaddr *)&la, sizeof la));
    ok("listen there", listen(r2, 4));
    close(r1);
    close(r2);
}

static void refused(void) {
    struct sockaddr_in a = sin_of(LOOP, port_closed());
    int s = socket(AF_INET, SOCK_STREAM, 0);
    ok("blocking connect to a closed port", connect(s, (struct sockaddr *)&a, sizeof a));
    printf("SO_ERROR after it: %s\n", ename(geti(s, SOL_SOCKET, SO_ERROR)));
    close(s);
    int n = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ok("non-blocking connect to a closed port", connect(n, (struct sockaddr *)&a, sizeof a));
    unsigned ev = wait_ev(n, POLLIN | POLLOUT | POLLRDHUP, POLLERR, 2000);
    printf("poll after the refusal: %s\n", evs(ev));
    printf("SO_ERROR: %s\n", ename(geti(n, SOL_SOCKET, SO_ERROR)));
    printf("SO_ERROR again: %s\n", ename(geti(n, SOL_SOCKET, SO_ERROR)));
    close(n);
    /* The error is reported by the next call when nobody asked SO_ERROR. */
    n = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    connect(n, (struct sockaddr *)&a, sizeof a);
    wait_ev(n, POLLOUT, POLLERR, 2000);
    ok("connect again after the refusal", connect(n, (struct sockaddr *)&a, sizeof a));
    close(n);
}

static void nonblocking_connect(void) {
    int l = listener(SOCK_NONBLOCK, 0);
    struct sockaddr_in la = addr_of(l);
    struct sockaddr_in in;
    socklen_t len = sizeof in;
    ok("accept on an empty queue (non-blocking)", accept(l, (struct sockaddr *)&in, &len));
    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ok("non-blocking connect to a listener", connect(c, (struct sockaddr *)&la, sizeof la));
    unsigned ev = wait_ev(c, POLLIN | POLLOUT | POLLRDHUP, POLLOUT, 2000);
    printf("poll after it: %s\n", evs(ev));
    printf("SO_ERROR: %s\n", ename(geti(c, SOL_SOCKET, SO_ERROR)));
    ok("connect again", connect(c, (struct sockaddr *)&la, sizeof la));
    printf("listener poll: %s\n", evs(wait_ev(l, POLLIN | POLLOUT, POLLIN, 2000)));
    len = sizeof in;
    memset(&in, 0, sizeof in);
    int a = accept4(l, (struct sockaddr *)&in, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    printf("accept4 SOCK_NONBLOCK|SOCK_CLOEXEC: %s, O_NONBLOCK %s FD_CLOEXEC %s\n",
           a >= 0 ? "ok" : ename(errno), yesno(is_nonblock(a)), yesno(is_cloexec(a)));
    printf("accepted address: family %s addr %s len %u, port is the client's %s\n",
           in.sin_family == AF_INET ? "AF_INET" : "?", inet_ntoa(in.sin_addr), (unsigned)len,
           yesno(in.sin_port == local_port(c)));
    printf("getpeername(client) is getsockname(accepted): %s\n",
           yesno(peer_port(c) == local_port(a) && peer_port(c) == la.sin_port));
    printf("getpeername(accepted) is getsockname(client): %s\n", yesno(peer_port(a) == local_port(c)));
    printf("client bound on connect: port nonzero %s\n", yesno(local_port(c) != 0));
    len = sizeof in;
    ok("accept on an empty queue again", accept(l, (struct sockaddr *)&in, &len));
    int b = socket(AF_INET, SOCK_STREAM, 0);
    connect(b, (struct sockaddr *)&la, sizeof la);
    wait_ev(l, POLLIN, POLLIN, 2000);
    struct sockaddr_in small;
    len = 4;
    int a2 = accept(l, (struct sockaddr *)&small, &len);
    printf("accept with addrlen 4: %s, addrlen %u, O_NONBLOCK %s\n", a2 >= 0 ? "ok" : ename(errno),
           (unsigned)len, yesno(is_nonblock(a2)));
    int a3 = -1;
    connect(socket(AF_INET, SOCK_STREAM, 0), (struct sockaddr *)&la, sizeof la);
    wait_ev(l, POLLIN, POLLIN, 2000);
    a3 = accept(l, NULL, NULL);
    printf("accept with NULL address: %s\n", a3 >= 0 ? "ok" : ename(errno));
    close(a3);
    close(a2);
    close(b);
    close(a);
    close(c);
    close(l);
}

static void transfer(void) {
    int c, a;
    tcp_pair(&c, &a);
    char buf[64];
    rc("send", send(c, "hello", 5, 0));
    wait_ev(a, POLLIN, POLLIN, 2000);
    int avail = -1;
    ioctl(a, FIONREAD, &avail);
    printf("FIONREAD: %d\n", avail);
    show_recv("recv MSG_PEEK", a, 16, MSG_PEEK);
    show_recv("recv", a, 16, 0);
    rc("recv MSG_DONTWAIT on an empty blocking socket", recv(a, buf, sizeof buf, MSG_DONTWAIT));
    rc("write", write(c, "world", 5));
    wait_ev(a, POLLIN, POLLIN, 2000);
    ssize_t r = read(a, buf, sizeof buf);
    printf("read: %zd \"%.*s\"\n", r, (int)(r > 0 ? r : 0), buf);
    struct iovec wv[3] = {{"ab", 2}, {"cde", 3}, {"f", 1}};
    rc("writev", writev(c, wv, 3));
    wait_ev(a, POLLIN, POLLIN, 2000);
    char p1[2], p2[8];
    struct iovec rv[2] = {{p1, 2}, {p2, 8}};
    r = readv(a, rv, 2);
    printf("readv: %zd \"%.2s|%.*s\"\n", r, p1, (int)(r > 2 ? r - 2 : 0), p2);
    rc("sendto with a NULL address", sendto(c, "ping", 4, 0, NULL, 0));
    wait_ev(a, POLLIN, POLLIN, 2000);
    struct sockaddr_in from;
    socklen_t flen = sizeof from;
    r = recvfrom(a, buf, sizeof buf, 0, (struct sockaddr *)&from, &flen);
    printf("recvfrom: %zd \"%.*s\" addrlen %u\n", r, (int)(r > 0 ? r : 0), buf, (unsigned)flen);
    struct sockaddr_in elsewhere = sin_of(LOOP, htons(9));
    rc("sendto with an address on a connected stream",
       sendto(c, "pong", 4, 0, (struct sockaddr *)&elsewhere, sizeof elsewhere));
    show_recv("recv", a, 16, 0);
    struct iovec mv[3] = {{"one ", 4}, {"two ", 4}, {"three", 5}};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = mv;
    m.msg_iovlen = 3;
    rc("sendmsg 3 iovecs", sendmsg(c, &m, 0));
    wait_ev(a, POLLIN, POLLIN, 2000);
    char q1[5], q2[20];
    struct iovec qv[2] = {{q1, 5}, {q2, 20}};
    struct msghdr h;
    memset(&h, 0, sizeof h);
    h.msg_iov = qv;
    h.msg_iovlen = 2;
    h.msg_name = &from;
    h.msg_namelen = sizeof from;
    r = recvmsg(a, &h, 0);
    printf("recvmsg 2 iovecs: %zd \"%.5s|%.*s\" namelen %u flags %d\n", r, q1,
           (int)(r > 5 ? r - 5 : 0), q2, (unsigned)h.msg_namelen, h.msg_flags);
    rc("send of 0 bytes", send(c, "", 0, 0));
    fcntl(a, F_SETFL, fcntl(a, F_GETFL) | O_NONBLOCK);
    rc("recv on an empty non-blocking socket", recv(a, buf, sizeof buf, 0));
    rc("read on an empty non-blocking socket", read(a, buf, sizeof buf));
    rc("recv of 0 bytes", recv(a, buf, 0, 0));
    close(a);
    close(c);
}

static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void big_transfer(void) {
    enum { TOTAL = 1 << 20 };
    static unsigned char out[TOTAL], in[65536];
    uint32_t x = 0x12345678;
    for (size_t i = 0; i < TOTAL; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        out[i] = (unsigned char)(x >> 11);
    }
    int l = listener(0, 0);
    struct sockaddr_in la = addr_of(l);
    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    seti(c, SOL_SOCKET, SO_SNDBUF, 8192);
    connect(c, (struct sockaddr *)&la, sizeof la);
    wait_ev(l, POLLIN, POLLIN, 2000);
    int a = accept4(l, NULL, NULL, SOCK_NONBLOCK);
    close(l);
    wait_ev(c, POLLOUT, POLLOUT, 2000);
    ssize_t first = send(c, out, TOTAL, 0);
    printf("first non-blocking send of 1 MiB is short: %s\n", yesno(first > 0 && first < TOTAL));
    size_t sent = first > 0 ? (size_t)first : 0, got = 0;
    int would_block = 0, eof = 0, shut = 0;
    uint64_t h = 0xcbf29ce484222325ULL, want = fnv(0xcbf29ce484222325ULL, out, TOTAL);
    while (!eof) {
        struct pollfd p[2] = {{c, shut ? 0 : POLLOUT, 0}, {a, POLLIN, 0}};
        if (poll(p, 2, 5000) <= 0) {
            printf("big transfer: stalled after %zu sent, %zu received\n", sent, got);
            break;
        }
        if (!shut && (p[0].revents & POLLOUT)) {
            ssize_t w = send(c, out + sent, TOTAL - sent, 0);
            if (w > 0)
                sent += (size_t)w;
            else if (w < 0 && errno == EAGAIN)
                would_block = 1;
            if (sent == TOTAL) {
                shutdown(c, SHUT_WR);
                shut = 1;
            }
        }
        if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            for (;;) {
                ssize_t r = recv(a, in, sizeof in, 0);
                if (r > 0) {
                    h = fnv(h, in, (size_t)r);
                    got += (size_t)r;
                    continue;
                }
                if (r == 0)
                    eof = 1;
                break;
            }
        }
        /* Fill the send buffer until it says EAGAIN at least once. */
        if (!shut && !would_block) {
            ssize_t w;
            while ((w = send(c, out + sent, TOTAL - sent, 0)) > 0)
                sent += (size_t)w;
            if (w < 0 && errno == EAGAIN)
                would_block = 1;
        }
    }
    printf("1 MiB transfer: %zu bytes, fnv-1a %016llx, matches %s, EAGAIN seen %s, eof %s\n", got,
           (unsigned long long)h, yesno(h == want && got == TOTAL), yesno(would_block), yesno(eof));
    close(a);
    close(c);
}

static void shutdowns(void) {
    int c, a;
    tcp_pair(&c, &a);
    ok("shutdown SHUT_WR", shutdown(c, SHUT_WR));
    unsigned ev = wait_ev(a, POLLIN | POLLOUT | POLLRDHUP, POLLIN | POLLRDHUP, 2000);
    printf("peer poll after SHUT_WR: %s\n", evs(ev));
    char buf[16];
    rc("peer recv after SHUT_WR", recv(a, buf, sizeof buf, 0));
    rc("peer recv again", recv(a, buf, sizeof buf, 0));
    rc("send after SHUT_WR", send(c, "x", 1, MSG_NOSIGNAL));
    rc("peer still sends", send(a, "back", 4, 0));
    show_recv("recv on the half-closed side", c, 16, 0);
    ok("shutdown SHUT_RD", shutdown(a, SHUT_RD));
    ok("shutdown with how 7", shutdown(a, 7));
    ok("peer shutdown SHUT_WR", shutdown(a, SHUT_WR));
    ev = wait_ev(c, POLLIN | POLLOUT | POLLRDHUP, POLLIN | POLLRDHUP | POLLHUP, 2000);
    printf("poll with both directions shut: %s\n", evs(ev));
    rc("recv after both shut", recv(c, buf, sizeof buf, 0));
    close(a);
    close(c);
}

static volatile sig_atomic_t pipes;

static void on_sigpipe(int sig) {
    (void)sig;
    pipes++;
}

static void pipes_and_resets(void) {
    int c, a;
    tcp_pair(&c, &a);
    close(a);
    unsigned ev = wait_ev(c, POLLIN | POLLOUT | POLLRDHUP, POLLIN | POLLRDHUP, 2000);
    printf("poll after the peer closed: %s\n", evs(ev));
    rc("send after the peer closed", send(c, "x", 1, MSG_NOSIGNAL));
    ev = wait_ev(c, POLLIN | POLLOUT | POLLRDHUP, POLLERR | POLLHUP, 2000);
    printf("poll after the reset: %s\n", evs(ev));
    rc("send MSG_NOSIGNAL after the reset", send(c, "x", 1, MSG_NOSIGNAL));
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigpipe;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
    rc("write with a SIGPIPE handler", write(c, "x", 1));
    printf("SIGPIPE handler ran: %d\n", (int)pipes);
    rc("send with a SIGPIPE handler", send(c, "x", 1, 0));
    printf("SIGPIPE handler ran: %d\n", (int)pipes);
    rc("send MSG_NOSIGNAL", send(c, "x", 1, MSG_NOSIGNAL));
    printf("SIGPIPE handler ran: %d\n", (int)pipes);
    rc("recv after the reset", recv(c, (char[8]){0}, 8, 0));
    close(c);

    /* Closing with unread data resets the connection. */
    tcp_pair(&c, &a);
    put(c, "unread");
    wait_ev(a, POLLIN, POLLIN, 2000);
    close(a);
    ev = wait_ev(c, POLLIN | POLLOUT | POLLRDHUP, POLLERR, 2000);
    printf("poll after a close with unread data: %s\n", evs(ev));
    char buf[16];
    rc("recv after a close with unread data", recv(c, buf, sizeof buf, 0));
    rc("recv again", recv(c, buf, sizeof buf, 0));
    rc("send then", send(c, "x", 1, MSG_NOSIGNAL));
    close(c);

    /* SO_LINGER {1, 0}: close sends a reset. */
    tcp_pair(&c, &a);
    struct linger lg = {1, 0};
    ok("SO_LINGER {1, 0}", setsockopt(a, SOL_SOCKET, SO_LINGER, &lg, sizeof lg));
    socklen_t len = sizeof lg;
    memset(&lg, 0, sizeof lg);
    getsockopt(a, SOL_SOCKET, SO_LINGER, &lg, &len);
    printf("SO_LINGER read back: onoff %d linger %d\n", lg.l_onoff, lg.l_linger);
    close(a);
    wait_ev(c, POLLIN, POLLERR, 2000);
    printf("SO_ERROR after a lingering close: %s\n", ename(geti(c, SOL_SOCKET, SO_ERROR)));
    rc("recv then", recv(c, buf, sizeof buf, 0));
    close(c);
    signal(SIGPIPE, SIG_DFL);
}

static void unconnected(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    char buf[8];
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    rc("recv on a never-connected socket", recv(s, buf, sizeof buf, 0));
    rc("read on a never-connected socket", read(s, buf, sizeof buf));
    rc("send on a never-connected socket", send(s, "x", 1, MSG_NOSIGNAL));
    ok("getpeername on a never-connected socket", getpeername(s, (struct sockaddr *)&a, &len));
    ok("shutdown on a never-connected socket", shutdown(s, SHUT_RDWR));
    ok("accept on a socket that does not listen", accept(s, NULL, NULL));
    printf("poll on a never-connected socket: %s\n", evs(wait_ev(s, POLLIN | POLLOUT, 0, 0)));
    close(s);
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    ok("listen on UDP", listen(u, 1));
    ok("accept on UDP", accept(u, NULL, NULL));
    close(u);
}

static void errors(void) {
    struct sockaddr_in a = sin_of(LOOP, 0);
    socklen_t len = sizeof a;
    char buf[8];
    ok("bind on a bad fd", bind(999, (struct sockaddr *)&a, sizeof a));
    ok("listen on a bad fd", listen(999, 1));
    ok("accept on a bad fd", accept(999, NULL, NULL));
    ok("connect on a bad fd", connect(999, (struct sockaddr *)&a, sizeof a));
    rc("send on a bad fd", send(999, "x", 1, 0));
    rc("recv on a bad fd", recv(999, buf, 1, 0));
    ok("getsockopt on a bad fd", getsockopt(999, SOL_SOCKET, SO_TYPE, buf, &len));
    int pfd[2];
    if (pipe(pfd) != 0)
        return;
    ok("bind on a pipe", bind(pfd[0], (struct sockaddr *)&a, sizeof a));
    ok("listen on a pipe", listen(pfd[0], 1));
    ok("connect on a pipe", connect(pfd[0], (struct sockaddr *)&a, sizeof a));
    len = sizeof a;
    ok("getsockname on a pipe", getsockname(pfd[0], (struct sockaddr *)&a, &len));
    rc("send on a pipe", send(pfd[1], "x", 1, 0));
    rc("recv on a pipe", recv(pfd[0], buf, 1, MSG_DONTWAIT));
    int v = 1;
    ok("setsockopt on a pipe", setsockopt(pfd[0], SOL_SOCKET, SO_REUSEADDR, &v, sizeof v));
    ok("shutdown on a pipe", shutdown(pfd[0], SHUT_RD));
    close(pfd[0]);
    close(pfd[1]);
    ok("socket with family 12345", socket(12345, SOCK_STREAM, 0));
    ok("socket with type 15", socket(AF_INET, 15, 0));
    ok("socket with unknown type flags", socket(AF_INET, SOCK_STREAM | 0x40000000, 0));
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in to = sin_of(LOOP, port_closed());
    ok("connect with addrlen 4", connect(s, (struct sockaddr *)&to, 4));
    ok("connect with a bad address pointer", connect(s, (struct sockaddr *)8, sizeof to));
    struct sockaddr_in unix_family = to;
    unix_family.sin_family = AF_UNIX;
    ok("connect with family AF_UNIX", connect(s, (struct sockaddr *)&unix_family, sizeof to));
    ok("getsockname with a bad address pointer", getsockname(s, (struct sockaddr *)8, &len));
    ok("getsockname with a bad length pointer", getsockname(s, (struct sockaddr *)&a, (socklen_t *)8));
    len = (socklen_t)-1;
    ok("getsockname with addrlen -1", getsockname(s, (struct sockaddr *)&a, &len));
    struct sockaddr_in b = sin_of(LOOP, 0);
    bind(s, (struct sockaddr *)&b, sizeof b);
    char tiny[4];
    len = sizeof tiny;
    ok("getsockname with addrlen 4", getsockname(s, (struct sockaddr *)tiny, &len));
    sa_family_t fam;
    memcpy(&fam, tiny, sizeof fam);
    printf("  addrlen then: %u, family %s\n", (unsigned)len, fam == AF_INET ? "AF_INET" : "?");
    rc("send with a bad buffer", send(s, (void *)8, 1, MSG_NOSIGNAL));
    close(s);
    int c, p;
    tcp_pair(&c, &p);
    rc("send from a bad buffer on a connection", send(c, (void *)8, 4, MSG_NOSIGNAL));
    put(c, "data");
    wait_ev(p, POLLIN, POLLIN, 2000);
    rc("recv into a bad buffer", recv(p, (void *)8, 4, 0));
    rc("recv after that", recv(p, buf, sizeof buf, 0));
    close(c);
    close(p);
}

static void options(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    printf("SO_REUSEADDR default: %d\n", geti(s, SOL_SOCKET, SO_REUSEADDR));
    seti(s, SOL_SOCKET, SO_REUSEADDR, 1);
    printf("SO_REUSEADDR set: %d\n", geti(s, SOL_SOCKET, SO_REUSEADDR));
    seti(s, SOL_SOCKET, SO_REUSEADDR, 0);
    printf("SO_REUSEADDR cleared: %d\n", geti(s, SOL_SOCKET, SO_REUSEADDR));
    printf("SO_REUSEPORT default: %d\n", geti(s, SOL_SOCKET, SO_REUSEPORT));
    seti(s, SOL_SOCKET, SO_REUSEPORT, 1);
    printf("SO_REUSEPORT set: %d\n", geti(s, SOL_SOCKET, SO_REUSEPORT));
    printf("SO_KEEPALIVE default: %d\n", geti(s, SOL_SOCKET, SO_KEEPALIVE));
    seti(s, SOL_SOCKET, SO_KEEPALIVE, 1);
    printf("SO_KEEPALIVE set: %d\n", geti(s, SOL_SOCKET, SO_KEEPALIVE));
    printf("TCP_NODELAY default: %d\n", geti(s, IPPROTO_TCP, TCP_NODELAY));
    seti(s, IPPROTO_TCP, TCP_NODELAY, 1);
    printf("TCP_NODELAY set: %d\n", geti(s, IPPROTO_TCP, TCP_NODELAY));
    seti(s, IPPROTO_TCP, TCP_NODELAY, 7);
    printf("TCP_NODELAY set to 7 reads: %d\n", geti(s, IPPROTO_TCP, TCP_NODELAY));
    seti(s, IPPROTO_TCP, TCP_NODELAY, 0);
    printf("TCP_NODELAY cleared: %d\n", geti(s, IPPROTO_TCP, TCP_NODELAY));
    printf("SO_ERROR: %s\n", ename(geti(s, SOL_SOCKET, SO_ERROR)));
    int small_r = geti(s, SOL_SOCKET, SO_RCVBUF);
    seti(s, SOL_SOCKET, SO_RCVBUF, 65536);
    int r = geti(s, SOL_SOCKET, SO_RCVBUF);
    printf("SO_RCVBUF: positive %s, at least what was set %s\n", yesno(small_r > 0), yesno(r >= 65536));
    int small_s = geti(s, SOL_SOCKET, SO_SNDBUF);
    seti(s, SOL_SOCKET, SO_SNDBUF, 65536);
    int w = geti(s, SOL_SOCKET, SO_SNDBUF);
    printf("SO_SNDBUF: positive %s, at least what was set %s\n", yesno(small_s > 0), yesno(w >= 65536));
    struct linger lg = {7, 7};
    socklen_t len = sizeof lg;
    getsockopt(s, SOL_SOCKET, SO_LINGER, &lg, &len);
    printf("SO_LINGER default: onoff %d linger %d len %u\n", lg.l_onoff, lg.l_linger, (unsigned)len);
    struct timeval tv = {0, 50000};
    ok("SO_RCVTIMEO", setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
    ok("SO_SNDTIMEO", setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv));
    int v = 1;
    ok("getsockopt level 12345", getsockopt(s, 12345, 1, &v, &len));
    len = sizeof v;
    ok("getsockopt SOL_SOCKET option 12345", getsockopt(s, SOL_SOCKET, 12345, &v, &len));
    ok("setsockopt SOL_SOCKET option 12345", setsockopt(s, SOL_SOCKET, 12345, &v, sizeof v));
    ok("setsockopt SO_REUSEADDR optlen 1", setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &v, 1));
    ok("setsockopt TCP_NODELAY optlen 2", setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, 2));
    ok("setsockopt with a bad value pointer", setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, (void *)8, 4));
    len = (socklen_t)-1;
    ok("getsockopt optlen -1", getsockopt(s, SOL_SOCKET, SO_TYPE, &v, &len));
    len = sizeof v;
    ok("getsockopt with a bad value pointer", getsockopt(s, SOL_SOCKET, SO_TYPE, (void *)8, &len));
    ok("getsockopt with a bad length pointer", getsockopt(s, SOL_SOCKET, SO_TYPE, &v, (socklen_t *)8));
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    ok("TCP_NODELAY on UDP", seti(u, IPPROTO_TCP, TCP_NODELAY, 1));
    v = 0;
    len = sizeof v;
    ok("SO_BROADCAST on UDP", seti(u, SOL_SOCKET, SO_BROADCAST, 1));
    printf("SO_BROADCAST read back: %d\n", geti(u, SOL_SOCKET, SO_BROADCAST));
    close(u);
    close(s);
}

static int ep_count(int ep, int ms, struct epoll_event *out, int max) {
    int n;
    do
        n = epoll_wait(ep, out, max, ms);
    while (n < 0 && errno == EINTR);
    return n;
}

static void epolls(void) {
    int c, a;
    tcp_pair(&c, &a);
    fcntl(a, F_SETFL, O_NONBLOCK);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = 1}, got[4];
    epoll_ctl(ep, EPOLL_CTL_ADD, a, &e);
    printf("epoll level, nothing yet: %d\n", ep_count(ep, 0, got, 4));
    put(c, "0123456789");
    int n1 = ep_count(ep, 2000, got, 4);
    char buf[64];
    recv(a, buf, 4, 0);
    int n2 = ep_count(ep, 0, got, 4);
    printf("epoll level: %d, after a partial read %d [events %s data %llu]\n", n1, n2,
           evs(got[0].events), (unsigned long long)got[0].data.u64);
    recv(a, buf, sizeof buf, 0);
    printf("epoll level after draining: %d\n", ep_count(ep, 0, got, 4));

    e.events = EPOLLIN | EPOLLET;
    e.data.u64 = 2;
    ok("EPOLL_CTL_MOD to edge-triggered", epoll_ctl(ep, EPOLL_CTL_MOD, a, &e));
    put(c, "0123456789");
    n1 = ep_count(ep, 2000, got, 4);
    recv(a, buf, 4, 0);
    n2 = ep_count(ep, 0, got, 4);
    put(c, "abc");
    int n3 = ep_count(ep, 2000, got, 4);
    int n4 = ep_count(ep, 0, got, 4);
    printf("epoll edge: %d, after a partial read %d, new data %d, then %d\n", n1, n2, n3, n4);
    ssize_t r = recv(a, buf, sizeof buf, 0);
    printf("edge then reads: %zd \"%.*s\"\n", r, (int)(r > 0 ? r : 0), buf);

    e.events = EPOLLIN | EPOLLONESHOT;
    e.data.u64 = 3;
    epoll_ctl(ep, EPOLL_CTL_MOD, a, &e);
    put(c, "once");
    n1 = ep_count(ep, 2000, got, 4);
    n2 = ep_count(ep, 0, got, 4);
    ok("EPOLL_CTL_MOD re-arms", epoll_ctl(ep, EPOLL_CTL_MOD, a, &e));
    n3 = ep_count(ep, 0, got, 4);
    n4 = ep_count(ep, 0, got, 4);
    printf("epoll one-shot: %d, then %d, re-armed %d, then %d\n", n1, n2, n3, n4);
    recv(a, buf, sizeof buf, 0);
    epoll_ctl(ep, EPOLL_CTL_DEL, a, NULL);

    e.events = EPOLLOUT;
    e.data.u64 = 4;
    epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
    n1 = ep_count(ep, 2000, got, 4);
    printf("epoll EPOLLOUT on a connected socket: %d [events %s data %llu]\n", n1,
           evs(got[0].events), (unsigned long long)got[0].data.u64);
    e.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
    e.data.u64 = 5;
    epoll_ctl(ep, EPOLL_CTL_MOD, c, &e);
    ok("peer shutdown SHUT_WR", shutdown(a, SHUT_WR));
    for (int i = 0; i < 200; i++) {
        n1 = ep_count(ep, 10, got, 4);
        if (n1 == 1 && (got[0].events & EPOLLRDHUP))
            break;
    }
    printf("epoll after the peer's SHUT_WR: %d [events %s]\n", n1, evs(got[0].events));
    shutdown(c, SHUT_WR);
    for (int i = 0; i < 200; i++) {
        n1 = ep_count(ep, 10, got, 4);
        if (n1 == 1 && (got[0].events & EPOLLHUP))
            break;
    }
    printf("epoll after both shut: %d [events %s]\n", n1, evs(got[0].events));
    epoll_ctl(ep, EPOLL_CTL_DEL, c, NULL);
    close(a);
    close(c);

    int l = listener(SOCK_NONBLOCK, 0);
    struct sockaddr_in la = addr_of(l);
    e.events = EPOLLIN;
    e.data.u64 = 6;
    epoll_ctl(ep, EPOLL_CTL_ADD, l, &e);
    printf("epoll on a listener, nothing pending: %d\n", ep_count(ep, 0, got, 4));
    int k = socket(AF_INET, SOCK_STREAM, 0);
    connect(k, (struct sockaddr *)&la, sizeof la);
    n1 = ep_count(ep, 2000, got, 4);
    printf("epoll on a listener, a connection pending: %d [events %s data %llu]\n", n1,
           evs(got[0].events), (unsigned long long)got[0].data.u64);
    int acc = accept(l, NULL, NULL);
    printf("epoll on a listener after accept: %d\n", ep_count(ep, 0, got, 4));
    epoll_ctl(ep, EPOLL_CTL_DEL, l, NULL);
    e.events = EPOLLIN | EPOLLRDHUP;
    e.data.u64 = 7;
    epoll_ctl(ep, EPOLL_CTL_ADD, acc, &e);
    close(k);
    for (int i = 0; i < 200; i++) {
        n1 = ep_count(ep, 10, got, 4);
        if (n1 == 1 && (got[0].events & EPOLLRDHUP))
            break;
    }
    printf("epoll after the peer closed: %d [events %s]\n", n1, evs(got[0].events));
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGUSR1);
    n1 = epoll_pwait(ep, got, 4, 2000, &mask);
    printf("epoll_pwait: %d [events %s data %llu]\n", n1, evs(got[0].events),
           (unsigned long long)got[0].data.u64);
    e.events = EPOLLIN;
    ok("EPOLL_CTL_ADD twice", epoll_ctl(ep, EPOLL_CTL_ADD, acc, &e));
    close(acc);
    close(l);

    /* An eventfd beside two sockets in one set. */
    tcp_pair(&c, &a);
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    e.events = EPOLLIN;
    e.data.u64 = 10;
    epoll_ctl(ep, EPOLL_CTL_ADD, efd, &e);
    e.data.u64 = 11;
    epoll_ctl(ep, EPOLL_CTL_ADD, a, &e);
    e.data.u64 = 12;
    epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
    printf("epoll eventfd and sockets, nothing yet: %d\n", ep_count(ep, 0, got, 4));
    uint64_t three = 3;
    if (write(efd, &three, 8) != 8)
        printf("eventfd write: %s\n", ename(errno));
    put(c, "z");
    unsigned seen = 0;
    for (int i = 0; i < 200 && seen != 3; i++) {
        int n = ep_count(ep, 10, got, 4);
        for (int j = 0; j < n; j++)
            seen |= got[j].data.u64 == 10 ? 1 : got[j].data.u64 == 11 ? 2 : 4;
    }
    printf("epoll eventfd and sockets: eventfd %s, socket with data %s, idle socket %s\n",
           yesno(seen & 1), yesno(seen & 2), yesno(seen & 4));
    uint64_t v = 0;
    if (read(efd, &v, 8) != 8)
        printf("eventfd read: %s\n", ename(errno));
    recv(a, buf, sizeof buf, 0);
    printf("epoll after both are read: %d (eventfd said %llu)\n", ep_count(ep, 0, got, 4),
           (unsigned long long)v);
    close(efd);
    close(a);
    close(c);
    close(ep);
}

static void polls(void) {
    int c, a;
    tcp_pair(&c, &a);
    put(c, "x");
    wait_ev(a, POLLIN, POLLIN, 2000);
    struct pollfd p[2] = {{a, POLLIN | POLLOUT, 0}, {c, POLLIN, 0}};
    int n = poll(p, 2, 1000);
    printf("poll: %d, readable+writable %s, idle %s\n", n, evs(p[0].revents), evs(p[1].revents));
    struct timespec ts = {1, 0};
    sigset_t mask;
    sigemptyset(&mask);
    p[0].revents = p[1].revents = 0;
    n = ppoll(p, 2, &ts, &mask);
    printf("ppoll: %d, %s and %s\n", n, evs(p[0].revents), evs(p[1].revents));
    struct pollfd bad = {999, POLLIN, 0};
    n = poll(&bad, 1, 0);
    printf("poll on a bad fd: %d %s\n", n, evs(bad.revents));
    fd_set r, w;
    FD_ZERO(&r);
    FD_ZERO(&w);
    FD_SET(a, &r);
    FD_SET(c, &r);
    FD_SET(a, &w);
    FD_SET(c, &w);
    struct timeval tv = {1, 0};
    int hi = (a > c ? a : c) + 1;
    n = select(hi, &r, &w, NULL, &tv);
    printf("select: %d, readable %s %s, writable %s %s\n", n, yesno(FD_ISSET(a, &r)),
           yesno(FD_ISSET(c, &r)), yesno(FD_ISSET(a, &w)), yesno(FD_ISSET(c, &w)));
    FD_ZERO(&r);
    FD_ZERO(&w);
    FD_SET(a, &r);
    FD_SET(c, &r);
    FD_SET(c, &w);
    n = pselect(hi, &r, &w, NULL, &ts, &mask);
    printf("pselect: %d, readable %s %s, writable %s\n", n, yesno(FD_ISSET(a, &r)),
           yesno(FD_ISSET(c, &r)), yesno(FD_ISSET(c, &w)));
    char buf[8];
    recv(a, buf, sizeof buf, 0);
    FD_ZERO(&r);
    FD_SET(a, &r);
    FD_SET(c, &r);
    struct timeval zero = {0, 0};
    n = select(hi, &r, NULL, NULL, &zero);
    printf("select with nothing readable: %d\n", n);
    struct timeval short_wait = {0, 20000};
    FD_ZERO(&r);
    FD_SET(a, &r);
    n = select(a + 1, &r, NULL, NULL, &short_wait);
    printf("select timeout on a socket: %d\n", n);
    int l = listener(0, 0);
    struct sockaddr_in la = addr_of(l);
    int k = socket(AF_INET, SOCK_STREAM, 0);
    connect(k, (struct sockaddr *)&la, sizeof la);
    wait_ev(l, POLLIN, POLLIN, 2000);
    FD_ZERO(&r);
    FD_SET(l, &r);
    n = select(l + 1, &r, NULL, NULL, &tv);
    printf("select on a listener with a connection pending: %d %s\n", n, yesno(FD_ISSET(l, &r)));
    close(k);
    close(l);
    close(a);
    close(c);
}

static void udp(void) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in any = sin_of(LOOP, 0);
    ok("udp bind 127.0.0.1:0", bind(s, (struct sockaddr *)&any, sizeof any));
    struct sockaddr_in sa = addr_of(s);
    int c = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in ca = addr_of(c);
    printf("udp unbound: addr %s port %d\n", inet_ntoa(ca.sin_addr), ntohs(ca.sin_port));
    rc("udp sendto", sendto(c, "datagram", 8, 0, (struct sockaddr *)&sa, sizeof sa));
    printf("udp sender bound by sendto: port nonzero %s\n", yesno(local_port(c) != 0));
    char buf[64];
    struct sockaddr_in from;
    socklen_t flen = sizeof from;
    wait_ev(s, POLLIN, POLLIN, 2000);
    ssize_t r = recvfrom(s, buf, sizeof buf, 0, (struct sockaddr *)&from, &flen);
    printf("udp recvfrom: %zd \"%.*s\" from %s, port is the sender's %s, addrlen %u\n", r,
           (int)(r > 0 ? r : 0), buf, inet_ntoa(from.sin_addr), yesno(from.sin_port == local_port(c)),
           (unsigned)flen);
    rc("udp reply", sendto(s, "reply", 5, 0, (struct sockaddr *)&from, flen));
    wait_ev(c, POLLIN, POLLIN, 2000);
    flen = sizeof from;
    r = recvfrom(c, buf, sizeof buf, 0, (struct sockaddr *)&from, &flen);
    printf("udp reply received: %zd \"%.*s\", from the server's port %s\n", r,
           (int)(r > 0 ? r : 0), buf, yesno(from.sin_port == sa.sin_port));
    rc("udp recv on an empty non-blocking socket", recv(c, buf, sizeof buf, 0));
    rc("udp send without an address", send(c, "x", 1, 0));
    rc("udp sendto with addrlen 4", sendto(c, "x", 1, 0, (struct sockaddr *)&sa, 4));
    ok("udp connect", connect(c, (struct sockaddr *)&sa, sizeof sa));
    printf("udp getpeername is the server: %s\n", yesno(peer_port(c) == sa.sin_port));
    rc("udp send one", send(c, "one", 3, 0));
    rc("udp send three", send(c, "three", 5, 0));
    rc("udp send empty", send(c, "", 0, 0));
    wait_ev(s, POLLIN, POLLIN, 2000);
    int avail = -1;
    ioctl(s, FIONREAD, &avail);
    printf("udp FIONREAD (the first datagram): %d\n", avail);
    for (int i = 0; i < 3; i++) {
        wait_ev(s, POLLIN, POLLIN, 2000);
        r = recv(s, buf, sizeof buf, 0);
        printf("udp datagram %d: %zd \"%.*s\"\n", i, r, (int)(r > 0 ? r : 0), buf);
    }
    rc("udp send", send(c, "0123456789", 10, 0));
    wait_ev(s, POLLIN, POLLIN, 2000);
    r = recv(s, buf, 4, MSG_PEEK | MSG_TRUNC);
    printf("udp recv MSG_PEEK|MSG_TRUNC into 4 bytes: %zd \"%.4s\"\n", r, buf);
    char small[4];
    struct iovec iv = {small, 4};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iv;
    m.msg_iovlen = 1;
    r = recvmsg(s, &m, 0);
    printf("udp recvmsg into 4 bytes: %zd \"%.4s\" MSG_TRUNC %s\n", r, small,
           yesno(m.msg_flags & MSG_TRUNC));
    rc("udp rest of it is gone", recv(s, buf, sizeof buf, MSG_DONTWAIT));
    rc("udp write", write(c, "written", 7));
    wait_ev(s, POLLIN, POLLIN, 2000);
    r = read(s, buf, sizeof buf);
    printf("udp read: %zd \"%.*s\"\n", r, (int)(r > 0 ? r : 0), buf);
    struct sockaddr_in unspec;
    memset(&unspec, 0, sizeof unspec);
    unspec.sin_family = AF_UNSPEC;
    ok("udp connect AF_UNSPEC", connect(c, (struct sockaddr *)&unspec, sizeof unspec));
    rc("udp send after disconnecting", send(c, "x", 1, 0));
    close(s);

    /* A connected UDP socket hears of a closed port (ICMP port unreachable). */
    struct sockaddr_in dead = sin_of(LOOP, port_closed_of(SOCK_DGRAM));
    int d = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    ok("udp connect to a closed port", connect(d, (struct sockaddr *)&dead, sizeof dead));
    rc("udp send there", send(d, "anyone", 6, 0));
    unsigned ev = wait_ev(d, POLLIN | POLLOUT, POLLERR, 2000);
    printf("udp poll then: %s\n", evs(ev));
    rc("udp recv then", recv(d, buf, sizeof buf, 0));
    rc("udp recv again", recv(d, buf, sizeof buf, 0));
    close(d);
    close(c);
}

static void toggling(void) {
    int c, a;
    tcp_pair(&c, &a);
    char buf[8];
    printf("accepted socket O_NONBLOCK: %s\n", yesno(is_nonblock(a)));
    ok("F_SETFL O_NONBLOCK", fcntl(a, F_SETFL, fcntl(a, F_GETFL) | O_NONBLOCK));
    printf("O_NONBLOCK now: %s\n", yesno(is_nonblock(a)));
    rc("recv then", recv(a, buf, sizeof buf, 0));
    ok("F_SETFL without O_NONBLOCK", fcntl(a, F_SETFL, fcntl(a, F_GETFL) & ~O_NONBLOCK));
    printf("O_NONBLOCK now: %s\n", yesno(is_nonblock(a)));
    struct timeval tv = {0, 30000};
    setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    rc("blocking recv with SO_RCVTIMEO 30 ms", recv(a, buf, sizeof buf, 0));
    int on = 1;
    ok("FIONBIO on", ioctl(a, FIONBIO, &on));
    printf("O_NONBLOCK now: %s\n", yesno(is_nonblock(a)));
    on = 0;
    ok("FIONBIO off", ioctl(a, FIONBIO, &on));
    printf("O_NONBLOCK now: %s\n", yesno(is_nonblock(a)));
    ok("F_SETFD FD_CLOEXEC", fcntl(a, F_SETFD, FD_CLOEXEC));
    printf("FD_CLOEXEC now: %s\n", yesno(is_cloexec(a)));
    int d = dup(a);
    put(c, "dup");
    show_recv("recv through a dup", d, 8, 0);
    close(d);
    close(a);
    close(c);
}

/* ---- waits another thread ends ---- */

static int helper_fd;
static struct sockaddr_in helper_addr;
static int helper_step;

static void *helper(void *arg) {
    (void)arg;
    nap(50);
    switch (helper_step) {
    case 0:
        put(helper_fd, "late");
        break;
    case 1: {
        int k = socket(AF_INET, SOCK_STREAM, 0);
        connect(k, (struct sockaddr *)&helper_addr, sizeof helper_addr);
        put(k, "hi");
        nap(50);
        close(k);
        break;
    }
    case 2:
        put(helper_fd, "ab");
        nap(30);
        put(helper_fd, "cd");
        break;
    case 3: {
        static char sink[1 << 16];
        ssize_t r;
        while ((r = recv(helper_fd, sink, sizeof sink, 0)) > 0)
            ;
        break;
    }
    case 4:
        put(helper_fd, "wake");
        break;
    case 5:
        shutdown(helper_fd, SHUT_RDWR);
        break;
    }
    return NULL;
}

static pthread_t start_helper(int step, int fd) {
    pthread_t t;
    helper_step = step;
    helper_fd = fd;
    pthread_create(&t, NULL, helper, NULL);
    return t;
}

static void blocking(void) {
    int c, a;
    tcp_pair(&c, &a);
    char buf[16];
    pthread_t t = start_helper(0, c);
    ssize_t r = recv(a, buf, sizeof buf, 0);
    printf("blocking recv woken by the peer: %zd \"%.*s\"\n", r, (int)(r > 0 ? r : 0), buf);
    pthread_join(t, NULL);

    int l = listener(0, 0);
    helper_addr = addr_of(l);
    t = start_helper(1, -1);
    int k = accept(l, NULL, NULL);
    printf("blocking accept woken by a connect: %s\n", k >= 0 ? "ok" : ename(errno));
    r = recv(k, buf, sizeof buf, MSG_WAITALL);
    printf("recv MSG_WAITALL until the peer closes: %zd \"%.*s\"\n", r, (int)(r > 0 ? r : 0), buf);
    pthread_join(t, NULL);
    close(k);
    close(l);

    t = start_helper(2, c);
    r = recv(a, buf, 4, MSG_WAITALL);
    printf("recv MSG_WAITALL of 4 over two sends: %zd \"%.*s\"\n", r, (int)(r > 0 ? r : 0), buf);
    pthread_join(t, NULL);

    /* A blocking send into full buffers waits until the peer reads. */
    int small = 4096;
    setsockopt(c, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    fcntl(c, F_SETFL, O_NONBLOCK);
    static char block[1 << 16];
    long queued = 0;
    for (;;) {
        ssize_t w = send(c, block, sizeof block, 0);
        if (w <= 0)
            break;
        queued += w;
    }
    printf("send buffers full: %s\n", ename(errno));
    fcntl(c, F_SETFL, 0);
    t = start_helper(3, a);
    r = send(c, block, 1000, 0);
    printf("blocking send into full buffers once the peer reads: %zd\n", r);
    shutdown(c, SHUT_WR);
    pthread_join(t, NULL);
    close(a);
    close(c);

    /* A blocking send of more than the buffers hold queues all of it. */
    tcp_pair(&c, &a);
    t = start_helper(3, a);
    static char mib[1 << 20];
    for (size_t i = 0; i < sizeof mib; i++)
        mib[i] = (char)(i * 7);
    r = send(c, mib, sizeof mib, 0);
    printf("blocking send of 1 MiB: %zd\n", r);
    shutdown(c, SHUT_WR);
    pthread_join(t, NULL);
    close(a);
    close(c);

    tcp_pair(&c, &a);
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = 9}, got[2];
    epoll_ctl(ep, EPOLL_CTL_ADD, a, &e);
    t = start_helper(4, c);
    int n = epoll_wait(ep, got, 2, 5000);
    printf("blocking epoll_wait woken by the peer: %d [events %s data %llu]\n", n,
           evs(got[0].events), (unsigned long long)got[0].data.u64);
    pthread_join(t, NULL);
    recv(a, buf, sizeof buf, 0);
    struct pollfd p = {c, POLLIN, 0};
    t = start_helper(5, a);
    n = poll(&p, 1, 5000);
    printf("blocking poll woken by the peer's shutdown: %d %s\n", n, evs(p.revents & SHOWN));
    pthread_join(t, NULL);
    close(ep);
    close(a);
    close(c);
    (void)queued;
}

/* ---- raw system calls: the socketcall multiplexer and direct calls ---- */

#ifdef __i386__
#define SC_SOCKET 1
#define SC_BIND 2
#define SC_CONNECT 3
#define SC_LISTEN 4
#define SC_ACCEPT 5
#define SC_GETSOCKNAME 6
#define SC_GETPEERNAME 7
#define SC_SEND 9
#define SC_RECV 10
#define SC_SENDTO 11
#define SC_RECVFROM 12
#define SC_SHUTDOWN 13
#define SC_SETSOCKOPT 14
#define SC_GETSOCKOPT 15
#define SC_SENDMSG 16
#define SC_RECVMSG 17
#define SC_ACCEPT4 18

static int use_socketcall;

static long sc(int call, long a0, long a1, long a2, long a3, long a4, long a5) {
    long args[6] = {a0, a1, a2, a3, a4, a5};
    return syscall(SYS_socketcall, call, args);
}
#endif

/* The sequence of raw calls; the first step that does not give what it
 * should, or NULL. */
static const char *raw_calls(void) {
    static char why[96];
#ifdef __i386__
#define CALL(sub, nr, a0, a1, a2, a3, a4, a5)                                                  \
    (use_socketcall ? sc(sub, (long)(a0), (long)(a1), (long)(a2), (long)(a3), (long)(a4),     \
                         (long)(a5))                                                           \
                    : syscall(nr, a0, a1, a2, a3, a4, a5))
#else
#define CALL(sub, nr, a0, a1, a2, a3, a4, a5) syscall(nr, a0, a1, a2, a3, a4, a5)
#endif
#define CHECK(name, cond)                                                                      \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            snprintf(why, sizeof why, "%s: %s", name, ename(errno));                           \
            return why;                                                                        \
        }                                                                                      \
    } while (0)
    struct sockaddr_in a = sin_of(LOOP, 0);
    socklen_t len = sizeof a;
    int one = 1, v = 0;
    long l = CALL(SC_SOCKET, SYS_socket, AF_INET, SOCK_STREAM, 0, 0, 0, 0);
    CHECK("socket", l >= 0);
    CHECK("setsockopt",
          CALL(SC_SETSOCKOPT, SYS_setsockopt, l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one, 0) == 0);
    CHECK("getsockopt", CALL(SC_GETSOCKOPT, SYS_getsockopt, l, SOL_SOCKET, SO_REUSEADDR, &v, &len,
                             0) == 0 && v == 1);
    CHECK("bind", CALL(SC_BIND, SYS_bind, l, &a, sizeof a, 0, 0, 0) == 0);
    CHECK("listen", CALL(SC_LISTEN, SYS_listen, l, 4, 0, 0, 0, 0) == 0);
    len = sizeof a;
    CHECK("getsockname", CALL(SC_GETSOCKNAME, SYS_getsockname, l, &a, &len, 0, 0, 0) == 0 &&
                             a.sin_port != 0);
    long c = CALL(SC_SOCKET, SYS_socket, AF_INET, SOCK_STREAM, 0, 0, 0, 0);
    CHECK("client socket", c >= 0);
    CHECK("connect", CALL(SC_CONNECT, SYS_connect, c, &a, sizeof a, 0, 0, 0) == 0);
    struct sockaddr_in p;
    len = sizeof p;
#ifdef __i386__
    /* i386 has no direct accept, only accept4. */
    long s = use_socketcall ? sc(SC_ACCEPT, l, (long)&p, (long)&len, 0, 0, 0)
                            : syscall(SYS_accept4, l, &p, &len, 0);
#else
    long s = syscall(SYS_accept, l, &p, &len);
#endif
    CHECK("accept", s >= 0 && p.sin_family == AF_INET);
    len = sizeof p;
    /* accept4 with a flag it does not know fails at once. */
    CHECK("accept4", CALL(SC_ACCEPT4, SYS_accept4, l, &p, &len, 1, 0, 0) < 0 && errno == EINVAL);
    len = sizeof p;
    CHECK("getpeername", CALL(SC_GETPEERNAME, SYS_getpeername, c, &p, &len, 0, 0, 0) == 0 &&
                             p.sin_port == a.sin_port);
    char buf[16];
#ifdef __i386__
    /* i386 has no direct send and recv: sendto and recvfrom stand in. */
    long sent = use_socketcall ? sc(SC_SEND, c, (long)"hello", 5, 0, 0, 0)
                               : syscall(SYS_sendto, c, "hello", 5, 0, NULL, 0);
    CHECK("send", sent == 5);
    struct pollfd pf = {(int)s, POLLIN, 0};
    poll(&pf, 1, 2000);
    long got = use_socketcall ? sc(SC_RECV, s, (long)buf, sizeof buf, 0, 0, 0)
                              : syscall(SYS_recvfrom, s, buf, sizeof buf, 0, NULL, NULL);
#else
    CHECK("send", syscall(SYS_sendto, c, "hello", 5, 0, NULL, 0) == 5);
    struct pollfd pf = {(int)s, POLLIN, 0};
    poll(&pf, 1, 2000);
    long got = syscall(SYS_recvfrom, s, buf, sizeof buf, 0, NULL, NULL);
#endif
    CHECK("recv", got == 5 && memcmp(buf, "hello", 5) == 0);
    CHECK("sendto", CALL(SC_SENDTO, SYS_sendto, s, "world", 5, 0, NULL, 0) == 5);
    poll(&(struct pollfd){(int)c, POLLIN, 0}, 1, 2000);
    struct sockaddr_in from;
    len = sizeof from;
    CHECK("recvfrom", CALL(SC_RECVFROM, SYS_recvfrom, c, buf, sizeof buf, 0, &from, &len) == 5 &&
                          len == 0);
    struct iovec iv = {"msg", 3};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iv;
    m.msg_iovlen = 1;
    CHECK("sendmsg", CALL(SC_SENDMSG, SYS_sendmsg, c, &m, 0, 0, 0, 0) == 3);
    poll(&pf, 1, 2000);
    struct iovec rv = {buf, sizeof buf};
    memset(&m, 0, sizeof m);
    m.msg_iov = &rv;
    m.msg_iovlen = 1;
    CHECK("recvmsg", CALL(SC_RECVMSG, SYS_recvmsg, s, &m, 0, 0, 0, 0) == 3 &&
                         memcmp(buf, "msg", 3) == 0);
    CHECK("shutdown", CALL(SC_SHUTDOWN, SYS_shutdown, c, SHUT_WR, 0, 0, 0, 0) == 0);
    poll(&pf, 1, 2000);
    CHECK("recv eof", CALL(SC_RECVFROM, SYS_recvfrom, s, buf, sizeof buf, 0, NULL, NULL) == 0);
    CHECK("bad socket", CALL(SC_SOCKET, SYS_socket, 12345, SOCK_STREAM, 0, 0, 0, 0) < 0 &&
                            errno == EAFNOSUPPORT);
    close((int)s);
    close((int)c);
    close((int)l);
    return NULL;
#undef CALL
#undef CHECK
}

static void raw(void) {
    const char *why;
#ifdef __i386__
    use_socketcall = 1;
    why = raw_calls();
    if (!why) {
        use_socketcall = 0;
        why = raw_calls();
    }
#else
    why = raw_calls();
#endif
    printf("raw socket calls: %s\n", why ? why : "ok");
    /* The multiplexer's own errors (an unknown call, a bad argument
     * block); 64-bit builds check the direct calls' counterparts (an
     * unknown socket type, a bad address). The same line either way. */
    int e1, e2, s = socket(AF_INET, SOCK_STREAM, 0);
#ifdef __i386__
    e1 = syscall(SYS_socketcall, 99, (long[6]){0}) < 0 ? errno : 0;
    e2 = syscall(SYS_socketcall, SC_SOCKET, (void *)8) < 0 ? errno : 0;
#else
    e1 = socket(AF_INET, 99, 0) < 0 ? errno : 0;
    e2 = bind(s, (struct sockaddr *)8, 16) < 0 ? errno : 0;
#endif
    close(s);
    printf("socketcall: %s\n", e1 == EINVAL && e2 == EFAULT ? "ok" : "unexpected errors");
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    creation();
    binding();
    refused();
    nonblocking_connect();
    transfer();
    big_transfer();
    shutdowns();
    pipes_and_resets();
    unconnected();
    errors();
    options();
    epolls();
    polls();
    udp();
    toggling();
    blocking();
    raw();
    printf("sockets done\n");
    return 0;
}
