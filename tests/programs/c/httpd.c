/*
 * httpd: a small HTTP/1.1 server on one thread, for profiling a server
 * under load (tests/tests/http.rs).
 *
 *   httpd PORT
 *
 * It listens on 0.0.0.0:PORT with non-blocking sockets and a level-triggered
 * epoll loop; connections are kept alive (HTTP/1.1, or HTTP/1.0 with
 * `Connection: keep-alive`), pipelined requests are answered in order, and
 * reads and writes may stop anywhere (a request is parsed once all of it is
 * in, a response is written on as the socket takes it). Request bodies
 * are read by their `Content-Length`; every response has one.
 *
 *   GET /             "hello from perch httpd\n"
 *   GET /hello        the same
 *   GET /work?n=N     renders a page of N rows (default 64, at most 20000)
 *                     and answers with its size and CRC-32 in one line:
 *                     the CPU work a profile sees (render_page, page_crc32)
 *   GET /page?n=N     the page itself (default 16 rows), as text/html
 *   POST /echo        the request body back
 *   GET /quit         "bye\n", then the server exits with status 0 once
 *                     that response is written
 *   anything else     404 (405 for methods other than GET, HEAD, POST; 400
 *                     for a malformed request, 413 for one over 16 KiB)
 *
 * stdout gets two deterministic lines, `httpd: listening on port PORT` and
 * `httpd: quit`; how many requests were served depends on the load, so that
 * count goes to stderr.
 *
 * System calls (x86-64): socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK),
 * setsockopt(SOL_SOCKET, SO_REUSEADDR), bind(0.0.0.0:PORT), listen(128),
 * epoll_create1(0), epoll_ctl (ADD, MOD, DEL), epoll_wait (musl:
 * epoll_pwait with no mask), accept4(NULL, NULL, SOCK_NONBLOCK), read and
 * write on the sockets (EAGAIN when they would block), shutdown(SHUT_WR),
 * close; besides, rt_sigaction (SIGPIPE ignored), stdio's write (musl:
 * writev) and ioctl on stdout, and malloc's brk and mmap.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

#define MAX_FDS 1024
#define IN_CAP 16384		/* the largest request, headers and body */
#define OUT_HIGH (256 * 1024)	/* stop parsing while this much waits */
#define MAX_ROWS 20000

struct conn {
	int fd;
	int peer_closed;	/* read returned 0: answer what came, then close */
	int closing;		/* close once the output is written */
	uint32_t events;	/* the epoll interest registered */
	size_t in_len;
	char in[IN_CAP];
	char *out;
	size_t out_len, out_off, out_cap;
};

struct request {
	char method[8];
	char path[256];
	int minor;		/* HTTP/1.minor */
	int keep_alive;
	const char *body;
	size_t body_len;
};

static struct conn *conns[MAX_FDS];
static int epfd = -1;
static int listen_fd = -1;
static int quitting;		/* /quit answered: exit when its reply is out */
static unsigned long served;

static void die(const char *what)
{
	perror(what);
	exit(1);
}

/* --- the page ----------------------------------------------------------- */

static uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static char *put_str(char *p, const char *s)
{
	while (*s)
		*p++ = *s++;
	return p;
}

static char *put_hex(char *p, uint64_t v, int digits)
{
	static const char hex[] = "0123456789abcdef";

	for (int i = digits - 1; i >= 0; i--)
		p[i] = hex[v & 15], v >>= 4;
	return p + digits;
}

static char *put_dec(char *p, unsigned long v)
{
	char tmp[24];
	int n = 0;

	do
		tmp[n++] = '0' + v % 10, v /= 10;
	while (v);
	while (n)
		*p++ = tmp[--n];
	return p;
}

/* The most bytes render_page writes for n rows. */
static size_t page_size_max(unsigned long n)
{
	return 128 + n * 96;
}

/*
 * A deterministic HTML table of n rows: each row a number, a value of a
 * xorshift stream seeded by n, and that value's bits mixed down (the
 * per-request work). Returns the length.
 */
NOINLINE static size_t render_page(char *buf, unsigned long n)
{
	uint64_t s = 0x9e3779b97f4a7c15ULL ^ n;
	char *p = buf;

	p = put_str(p, "<html><body><table>\n");
	for (unsigned long i = 0; i < n; i++) {
		uint64_t v = xorshift(&s);
		uint64_t m = v;

		for (int r = 0; r < 16; r++)
			m = (m ^ (m >> 29)) * 0xbf58476d1ce4e5b9ULL + r;
		p = put_str(p, "<tr><td>");
		p = put_dec(p, i);
		p = put_str(p, "</td><td>");
		p = put_hex(p, v, 16);
		p = put_str(p, "</td><td>");
		p = put_hex(p, m, 16);
		p = put_str(p, "</td></tr>\n");
	}
	p = put_str(p, "</table></body></html>\n");
	return (size_t)(p - buf);
}

/* CRC-32 (IEEE, bit at a time) of the page. */
NOINLINE static uint32_t page_crc32(const char *buf, size_t len)
{
	uint32_t crc = 0xffffffffu;

	for (size_t i = 0; i < len; i++) {
		crc ^= (unsigned char)buf[i];
		for (int k = 0; k < 8; k++)
			crc = (crc >> 1) ^ (0xedb88320u & -(crc & 1));
	}
	return ~crc;
}

/* --- output ------------------------------------------------------------- */

static void out_reserve(struct conn *c, size_t more)
{
	if (c->out_off == c->out_len)
		c->out_off = c->out_len = 0;
	if (c->out_len + more <= c->out_cap)
		return;
	if (c->out_off) {
		memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
		c->out_len -= c->out_off;
		c->out_off = 0;
		if (c->out_len + more <= c->out_cap)
			return;
	}
	size_t cap = c->out_cap ? c->out_cap : 4096;

	while (cap < c->out_len + more)
		cap *= 2;
	c->out = realloc(c->out, cap);
	if (!c->out)
		die("realloc");
	c->out_cap = cap;
}

static void out_append(struct conn *c, const char *s, size_t n)
{
	out_reserve(c, n);
	memcpy(c->out + c->out_len, s, n);
	c->out_len += n;
}

/* A response: status line, headers, and the body unless HEAD. */
static void respond(struct conn *c, const struct request *rq, int code,
		    const char *reason, const char *type, const char *body,
		    size_t len)
{
	char head[256];
	char *p = head;

	p = put_str(p, "HTTP/1.1 ");
	p = put_dec(p, (unsigned long)code);
	p = put_str(p, " ");
	p = put_str(p, reason);
	p = put_str(p, "\r\nServer: perch-httpd\r\nContent-Type: ");
	p = put_str(p, type);
	p = put_str(p, "\r\nContent-Length: ");
	p = put_dec(p, len);
	if (code == 405)
		p = put_str(p, "\r\nAllow: GET, HEAD, POST");
	p = put_str(p, c->closing ? "\r\nConnection: close\r\n\r\n"
		    : "\r\nConnection: keep-alive\r\n\r\n");
	out_append(c, head, (size_t)(p - head));
	if (!rq || strcmp(rq->method, "HEAD") != 0)
		out_append(c, body, len);
	served++;
}

/* --- requests ----------------------------------------------------------- */

static int header_is(const char *name, size_t nlen, const char *want)
{
	return nlen == strlen(want) && strncasecmp(name, want, nlen) == 0;
}

static int value_has(const char *v, size_t vlen, const char *token)
{
	size_t t = strlen(token);

	for (size_t i = 0; i + t <= vlen; i++)
		if (strncasecmp(v + i, token, t) == 0)
			return 1;
	return 0;
}

/*
 * Parses the request at the start of buf[0..len]. Returns its length
 * (head and body) once all of it is there, 0 if more must come, -1 if it
 * is malformed, -2 if it cannot fit in the input buffer.
 */
NOINLINE static long parse_request(const char *buf, size_t len,
				   struct request *rq)
{
	const char *end = NULL;

	for (size_t i = 0; i + 3 < len; i++)
		if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r'
		    && buf[i + 3] == '\n') {
			end = buf + i;
			break;
		}
	if (!end)
		return len >= IN_CAP ? -2 : 0;

	/* The request line: METHOD SP TARGET SP HTTP/1.x CRLF */
	const char *p = buf, *line_end = memchr(buf, '\r', (size_t)(end - buf) + 1);
	const char *sp = memchr(p, ' ', (size_t)(line_end - p));

	if (!sp || sp == p || (size_t)(sp - p) >= sizeof rq->method)
		return -1;
	memcpy(rq->method, p, (size_t)(sp - p));
	rq->method[sp - p] = 0;
	p = sp + 1;
	sp = memchr(p, ' ', (size_t)(line_end - p));
	if (!sp || sp == p || (size_t)(sp - p) >= sizeof rq->path || *p != '/')
		return -1;
	memcpy(rq->path, p, (size_t)(sp - p));
	rq->path[sp - p] = 0;
	p = sp + 1;
	if (line_end - p != 8 || memcmp(p, "HTTP/1.", 7) != 0
	    || (p[7] != '0' && p[7] != '1'))
		return -1;
	rq->minor = p[7] - '0';
	rq->keep_alive = rq->minor == 1;

	/* Headers: NAME: VALUE CRLF, up to the empty line. */
	unsigned long clen = 0;

	p = line_end + 2;
	while (p < end) {
		const char *eol = memchr(p, '\r', (size_t)(end - p) + 1);
		const char *colon = memchr(p, ':', (size_t)(eol - p));

		if (!colon || colon == p)
			return -1;
		const char *v = colon + 1;

		while (v < eol && (*v == ' ' || *v == '\t'))
			v++;
		size_t nlen = (size_t)(colon - p), vlen = (size_t)(eol - v);

		if (header_is(p, nlen, "Content-Length")) {
			if (vlen == 0 || vlen > 9)
				return -1;
			clen = 0;
			for (size_t i = 0; i < vlen; i++) {
				if (v[i] < '0' || v[i] > '9')
					return -1;
				clen = clen * 10 + (unsigned long)(v[i] - '0');
			}
		} else if (header_is(p, nlen, "Transfer-Encoding")) {
			return -1;	/* no chunked bodies */
		} else if (header_is(p, nlen, "Connection")) {
			if (value_has(v, vlen, "close"))
				rq->keep_alive = 0;
			else if (value_has(v, vlen, "keep-alive"))
				rq->keep_alive = 1;
		}
		p = eol + 2;
	}
	size_t head = (size_t)(end - buf) + 4;

	if (head + clen > IN_CAP)
		return -2;
	if (len < head + clen)
		return 0;
	rq->body = buf + head;
	rq->body_len = clen;
	return (long)(head + clen);
}

/* The value of query parameter `key` in path, or dflt. */
static unsigned long query_num(const char *path, const char *key,
			       unsigned long dflt)
{
	const char *q = strchr(path, '?');
	size_t klen = strlen(key);

	while (q) {
		q++;
		if (strncmp(q, key, klen) == 0 && q[klen] == '=') {
			unsigned long v = 0;

			for (q += klen + 1; *q >= '0' && *q <= '9'; q++)
				v = v * 10 + (unsigned long)(*q - '0');
			return v;
		}
		q = strchr(q, '&');
	}
	return dflt;
}

static int path_is(const char *path, const char *want)
{
	size_t n = strlen(want);

	return strncmp(path, want, n) == 0 && (path[n] == 0 || path[n] == '?');
}

static const char hello[] = "hello from perch httpd\n";

/* Answers one parsed request on c. */
NOINLINE static void handle_request(struct conn *c, const struct request *rq)
{
	int get = strcmp(rq->method, "GET") == 0 || strcmp(rq->method, "HEAD") == 0;
	int post = strcmp(rq->method, "POST") == 0;

	if (!rq->keep_alive)
		c->closing = 1;
	if (!get && !post) {
		static const char m[] = "method not allowed\n";

		respond(c, rq, 405, "Method Not Allowed", "text/plain", m, sizeof m - 1);
		return;
	}
	if (get && (path_is(rq->path, "/") || path_is(rq->path, "/hello"))) {
		respond(c, rq, 200, "OK", "text/plain", hello, sizeof hello - 1);
	} else if (get && (path_is(rq->path, "/work") || path_is(rq->path, "/page"))) {
		int work = path_is(rq->path, "/work");
		unsigned long n = query_num(rq->path, "n", work ? 64 : 16);

		if (n > MAX_ROWS)
			n = MAX_ROWS;
		char *page = malloc(page_size_max(n));

		if (!page)
			die("malloc");
		size_t len = render_page(page, n);

		if (work) {
			char line[96], *p = line;

			p = put_str(p, "rows ");
			p = put_dec(p, n);
			p = put_str(p, " bytes ");
			p = put_dec(p, len);
			p = put_str(p, " crc32 ");
			p = put_hex(p, page_crc32(page, len), 8);
			*p++ = '\n';
			respond(c, rq, 200, "OK", "text/plain", line, (size_t)(p - line));
		} else {
			respond(c, rq, 200, "OK", "text/html", page, len);
		}
		free(page);
	} else if (post && path_is(rq->path, "/echo")) {
		respond(c, rq, 200, "OK", "application/octet-stream", rq->body,
			rq->body_len);
	} else if (get && path_is(rq->path, "/quit")) {
		static const char bye[] = "bye\n";

		c->closing = 1;
		quitting = 1;
		respond(c, rq, 200, "OK", "text/plain", bye, sizeof bye - 1);
	} else {
		static const char nf[] = "not found\n";

		respond(c, rq, 404, "Not Found", "text/plain", nf, sizeof nf - 1);
	}
}

/* --- connections -------------------------------------------------------- */

static int live;		/* open connections */

static void conn_close(struct conn *c)
{
	epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	conns[c->fd] = NULL;
	free(c->out);
	free(c);
	live--;
}

/* Level-triggered interest from c's state: input while it may come and
 * fits, output while some waits. */
static void update_interest(struct conn *c)
{
	uint32_t want = 0;

	if (!c->peer_closed && !c->closing && c->in_len < IN_CAP)
		want |= EPOLLIN;
	if (c->out_off < c->out_len)
		want |= EPOLLOUT;
	if (want == c->events)
		return;
	struct epoll_event ev = { .events = want, .data.fd = c->fd };

	if (epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0)
		die("epoll_ctl MOD");
	c->events = want;
}

/* Answers the complete requests in c's input while the output has room. */
static void process_input(struct conn *c)
{
	size_t used = 0;

	while (!c->closing && c->out_len - c->out_off < OUT_HIGH) {
		struct request rq;
		long n = parse_request(c->in + used, c->in_len - used, &rq);

		if (n == 0)
			break;
		if (n < 0) {
			static const char bad[] = "bad request\n";
			static const char big[] = "request too large\n";

			c->closing = 1;
			if (n == -1)
				respond(c, NULL, 400, "Bad Request", "text/plain", bad,
					sizeof bad - 1);
			else
				respond(c, NULL, 413, "Content Too Large",
					"text/plain", big, sizeof big - 1);
			break;
		}
		handle_request(c, &rq);
		used += (size_t)n;
	}
	memmove(c->in, c->in + used, c->in_len - used);
	c->in_len -= used;
}

/*
 * Writes what c has to send, as far as the socket takes it; closes c once
 * all is written and nothing more is to be answered. Returns 0 if c is
 * still open, -1 if it was closed.
 */
static int flush_output(struct conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);

		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN)
			return 0;
		if (w <= 0) {
			conn_close(c);
			return -1;
		}
		c->out_off += (size_t)w;
	}
	if (c->closing || c->peer_closed) {
		/* With the peer gone, what is left in the input is a part
		 * of a request that will never be whole. */
		shutdown(c->fd, SHUT_WR);
		conn_close(c);
		return -1;
	}
	return 0;
}

/* One event on c: a read, the requests it completes, the answers. */
static void serve(struct conn *c, uint32_t events)
{
	if (events & EPOLLERR) {
		conn_close(c);
		return;
	}
	if ((c->events & EPOLLIN) && (events & (EPOLLIN | EPOLLHUP))) {
		ssize_t r = read(c->fd, c->in + c->in_len, IN_CAP - c->in_len);

		if (r > 0)
			c->in_len += (size_t)r;
		else if (r == 0)
			c->peer_closed = 1;
		else if (errno != EAGAIN && errno != EINTR) {
			conn_close(c);
			return;
		}
	}
	/* Answering stops while much output waits: once it is written, the
	 * requests still in the input are next. */
	for (;;) {
		size_t before = c->in_len;
		int held = c->out_len - c->out_off >= OUT_HIGH;

		process_input(c);
		if (flush_output(c) < 0)
			return;
		if (c->out_off < c->out_len || (c->in_len == before && !held))
			break;
	}
	update_interest(c);
}

static void accept_all(void)
{
	for (;;) {
		int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK);

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			return;	/* EAGAIN, or out of descriptors for now */
		}
		if (fd >= MAX_FDS) {
			close(fd);
			continue;
		}
		struct conn *c = calloc(1, sizeof *c);

		if (!c)
			die("calloc");
		c->fd = fd;
		c->events = EPOLLIN;
		conns[fd] = c;
		live++;
		struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };

		if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
			die("epoll_ctl ADD");
	}
}

/* After /quit: no new connections, and of the open ones only those still
 * writing a last answer stay (they close once it is out). */
static void wind_down(void)
{
	if (listen_fd >= 0) {
		epoll_ctl(epfd, EPOLL_CTL_DEL, listen_fd, NULL);
		close(listen_fd);
		listen_fd = -1;
	}
	for (int fd = 0; fd < MAX_FDS; fd++) {
		struct conn *c = conns[fd];

		if (c && !(c->closing && c->out_off < c->out_len))
			conn_close(c);
	}
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: httpd PORT\n");
		return 2;
	}
	int port = atoi(argv[1]);

	if (port <= 0 || port > 65535) {
		fprintf(stderr, "httpd: bad port %s\n", argv[1]);
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);

	listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (listen_fd < 0)
		die("socket");
	int one = 1;

	if (setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
		die("setsockopt SO_REUSEADDR");
	struct sockaddr_in sa = { .sin_family = AF_INET,
				  .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_ANY) };

	if (bind(listen_fd, (struct sockaddr *)&sa, sizeof sa) < 0)
		die("bind");
	if (listen(listen_fd, 128) < 0)
		die("listen");
	epfd = epoll_create1(0);
	if (epfd < 0)
		die("epoll_create1");
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = listen_fd };

	if (epoll_ctl(epfd, EPOLL_CTL_ADD, listen_fd, &ev) < 0)
		die("epoll_ctl ADD");
	printf("httpd: listening on port %d\n", port);
	fflush(stdout);

	struct epoll_event evs[64];

	while (!quitting || live > 0) {
		int n = epoll_wait(epfd, evs, 64, -1);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("epoll_wait");
		}
		for (int i = 0; i < n; i++) {
			int fd = evs[i].data.fd;

			if (fd == listen_fd && listen_fd >= 0)
				accept_all();
			else if (fd != listen_fd && conns[fd])
				serve(conns[fd], evs[i].events);
		}
		if (quitting)
			wind_down();
	}
	close(epfd);
	printf("httpd: quit\n");
	fflush(stdout);
	fprintf(stderr, "httpd: served %lu requests\n", served);
	return 0;
}
