/* netpeer: the two ends of a TCP line echo and of a UDP echo, for runs
 * where the peers are separate processes of one appliance or where one end
 * is on the host (QEMU's user network: the host is 10.0.2.2).
 *
 *   netpeer serve PORT          TCP: accept one connection on PORT, answer
 *                               each line with "echo: LINE", until the
 *                               peer shuts its side
 *   netpeer client HOST PORT    TCP: connect (retrying while the peer or
 *                               the network is not up yet), send three
 *                               lines, shut the sending side, print the
 *                               replies until EOF
 *   netpeer udp-serve PORT N    UDP: answer N datagrams with their bytes
 *   netpeer udp-echo HOST PORT  UDP: send three datagrams, each resent
 *                               until its echo comes back, and print them
 *
 * Every line is deterministic: no ports the kernel picks, no retry counts,
 * no times. Exit status 0 when the exchange worked, 1 when it did not. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define LINES 3
/* How long a client keeps trying to reach its peer. */
#define GIVE_UP_MS 60000

static void nap(int ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static struct sockaddr_in addr(const char *host, const char *port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)atoi(port));
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
        printf("netpeer: bad address %s\n", host);
        exit(2);
    }
    return a;
}

static int send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads fd to EOF, calling `line` for each complete line; the count. */
static int each_line(int fd, void (*line)(int fd, const char *text)) {
    char buf[4096];
    size_t have = 0;
    int count = 0;
    for (;;) {
        ssize_t r = recv(fd, buf + have, sizeof buf - 1 - have, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            printf("netpeer: recv: %s\n", strerror(errno));
            return -1;
        }
        if (r == 0)
            break;
        have += (size_t)r;
        char *nl;
        while ((nl = memchr(buf, '\n', have)) != NULL) {
            *nl = 0;
            line(fd, buf);
            count++;
            have -= (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, have);
        }
        if (have == sizeof buf - 1)
            have = 0;
    }
    return count;
}

static void answer(int fd, const char *text) {
    char out[4200];
    int n = snprintf(out, sizeof out, "echo: %s\n", text);
    printf("serve: %s\n", text);
    if (send_all(fd, out, (size_t)n) != 0)
        printf("serve: send: %s\n", strerror(errno));
}

static int serve(const char *port) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = addr("0.0.0.0", port);
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 4) != 0) {
        printf("serve: bind/listen: %s\n", strerror(errno));
        return 1;
    }
    printf("serve: listening\n");
    struct sockaddr_in peer;
    socklen_t len = sizeof peer;
    int c;
    while ((c = accept(l, (struct sockaddr *)&peer, &len)) < 0 && errno == EINTR)
        ;
    if (c < 0) {
        printf("serve: accept: %s\n", strerror(errno));
        return 1;
    }
    close(l);
    printf("serve: connection from %s\n", inet_ntoa(peer.sin_addr));
    int n = each_line(c, answer);
    printf("serve: %d lines, then the peer shut its side\n", n);
    close(c);
    return n == LINES ? 0 : 1;
}

static void reply(int fd, const char *text) {
    (void)fd;
    printf("client: %s\n", text);
}

static int client(const char *host, const char *port) {
    struct sockaddr_in a = addr(host, port);
    long start = now_ms();
    int c = -1, err = 0;
    while (now_ms() - start < GIVE_UP_MS) {
        c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0) {
            printf("client: socket: %s\n", strerror(errno));
            return 1;
        }
        if (connect(c, (struct sockaddr *)&a, sizeof a) == 0)
            break;
        err = errno;
        close(c);
        c = -1;
        if (err == ENOSYS || err == EBADF || err == ENOTSOCK || err == EINVAL || err == EFAULT ||
            err == EAFNOSUPPORT)
            break;
        nap(100);
    }
    if (c < 0) {
        printf("client: connect: %s\n", strerror(err));
        return 1;
    }
    printf("client: connected\n");
    for (int i = 1; i <= LINES; i++) {
        char line[32];
        int n = snprintf(line, sizeof line, "line %d\n", i);
        if (send_all(c, line, (size_t)n) != 0) {
            printf("client: send: %s\n", strerror(errno));
            return 1;
        }
    }
    shutdown(c, SHUT_WR);
    int n = each_line(c, reply);
    printf("client: %d replies, then EOF\n", n);
    close(c);
    return n == LINES ? 0 : 1;
}

static int udp_serve(const char *port, int count) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = addr("0.0.0.0", port);
    if (bind(s, (struct sockaddr *)&a, sizeof a) != 0) {
        printf("udp-serve: bind: %s\n", strerror(errno));
        return 1;
    }
    printf("udp-serve: bound\n");
    char buf[2048];
    char last[2048] = "";
    int answered = 0;
    while (answered < count) {
        struct sockaddr_in from;
        socklen_t len = sizeof from;
        ssize_t r = recvfrom(s, buf, sizeof buf - 1, 0, (struct sockaddr *)&from, &len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            printf("udp-serve: recvfrom: %s\n", strerror(errno));
            return 1;
        }
        buf[r] = 0;
        sendto(s, buf, (size_t)r, 0, (struct sockaddr *)&from, len);
        /* A resent datagram is answered again but counted once. */
        if (strcmp(buf, last) != 0) {
            printf("udp-serve: %s\n", buf);
            strcpy(last, buf);
            answered++;
        }
    }
    /* Answer resends of the last one a little longer. */
    long start = now_ms();
    while (now_ms() - start < 2000) {
        struct pollfd p = {s, POLLIN, 0};
        if (poll(&p, 1, 200) != 1)
            continue;
        struct sockaddr_in from;
        socklen_t len = sizeof from;
        ssize_t r = recvfrom(s, buf, sizeof buf, 0, (struct sockaddr *)&from, &len);
        if (r > 0)
            sendto(s, buf, (size_t)r, 0, (struct sockaddr *)&from, len);
    }
    printf("udp-serve: %d datagrams answered\n", answered);
    close(s);
    return 0;
}

static int udp_echo(const char *host, const char *port) {
    struct sockaddr_in a = addr(host, port);
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0) {
        printf("udp: socket: %s\n", strerror(errno));
        return 1;
    }
    long start = now_ms();
    for (int i = 1; i <= LINES; i++) {
        char msg[32], buf[2048];
        int n = snprintf(msg, sizeof msg, "ping %d", i);
        int done = 0;
        while (!done && now_ms() - start < GIVE_UP_MS) {
            if (sendto(s, msg, (size_t)n, 0, (struct sockaddr *)&a, sizeof a) < 0) {
                if (errno == ENOSYS || errno == EBADF || errno == ENOTSOCK || errno == EINVAL ||
                    errno == EFAULT) {
                    printf("udp: sendto: %s\n", strerror(errno));
                    return 1;
                }
                /* The network may not be up yet. */
                nap(100);
                continue;
            }
            struct pollfd p = {s, POLLIN, 0};
            long t0 = now_ms();
            while (!done && now_ms() - t0 < 300) {
                if (poll(&p, 1, 50) != 1)
                    continue;
                struct sockaddr_in from;
                socklen_t len = sizeof from;
                ssize_t r = recvfrom(s, buf, sizeof buf - 1, MSG_DONTWAIT,
                                     (struct sockaddr *)&from, &len);
                if (r < 0)
                    continue; /* ECONNREFUSED while the peer is not bound */
                buf[r] = 0;
                if (strcmp(buf, msg) != 0)
                    continue; /* the late echo of an earlier resend */
                printf("udp: \"%s\" came back from the server: %s\n", buf,
                       from.sin_addr.s_addr == a.sin_addr.s_addr && from.sin_port == a.sin_port
                           ? "yes"
                           : "no");
                done = 1;
            }
        }
        if (!done) {
            printf("udp: no echo of \"%s\"\n", msg);
            return 1;
        }
    }
    printf("udp: done\n");
    close(s);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 3 && strcmp(argv[1], "serve") == 0)
        return serve(argv[2]);
    if (argc == 4 && strcmp(argv[1], "client") == 0)
        return client(argv[2], argv[3]);
    if (argc == 4 && strcmp(argv[1], "udp-serve") == 0)
        return udp_serve(argv[2], atoi(argv[3]));
    if (argc == 4 && strcmp(argv[1], "udp-echo") == 0)
        return udp_echo(argv[2], argv[3]);
    fprintf(stderr, "usage: netpeer serve PORT | client HOST PORT | udp-serve PORT N | "
                    "udp-echo HOST PORT\n");
    return 2;
}
