/*
 * hostile: threads, futexes and signals used the way a careless or hostile
 * program uses them, for tests/tests/hostile.rs. One act per process:
 *
 *   hostile limit N     threads that wait on a futex gate, made until
 *                       pthread_create fails or N exist; prints how many
 *                       and the error, then opens the gate, joins them all
 *                       and makes one more thread (the count went down),
 *                       then 2N more one at a time (each joined).
 *   hostile dead        signals to a thread that has exited and been
 *                       joined (tgkill, tkill, signal 0 too, an invalid
 *                       one too): ESRCH; to a living one: 0 (an invalid
 *                       signal: EINVAL).
 *   hostile cleartid    three threads wait on the tid word of a fourth
 *                       (set_tid_address) with FUTEX_WAIT and no timeout;
 *                       the fourth exits, the kernel clears and wakes the
 *                       word, and each woken waiter wakes the rest.
 *   hostile robust      a thread locks a robust mutex and exits holding
 *                       it while three others wait for it: one gets
 *                       EOWNERDEAD, makes it consistent, and all lock it.
 *   hostile main-exits  the main thread exits (pthread_exit) while a
 *                       thread waits on a futex; another wakes it later,
 *                       and the last thread to end ends the process, 0.
 *   hostile abandon     three threads wait on futexes no one will wake;
 *                       the main thread returns from main (exit_group).
 *   hostile sockets     sockets until the kernel refuses one (EMFILE
 *                       natively; ENOBUFS or EMFILE under the runtime,
 *                       whose heap runs out first), connections left
 *                       half-open, a client that vanishes mid-request
 *                       with a reset; then all of them closed, and a new
 *                       connection still carries data.
 *   hostile forks N     children that block reading a pipe, forked until
 *                       fork fails or N exist; prints how many and the
 *                       error, then closes the pipe, reaps them all and
 *                       forks one more (the count went down), then 2N more
 *                       one at a time (each reaped).
 *   hostile bomb        every process forks for ever; the runtime's process
 *                       table refuses the 64th with EAGAIN, and the run's
 *                       duration ends them all. It runs only with
 *                       PERCH_FUZZ_GUEST=1 in its environment (the test
 *                       sets it in the manifest), never by accident on a
 *                       host.
 *
 * Every line is deterministic (no tids, times or addresses), and the same
 * natively and under the runtime, but for `limit` and `forks`, whose count
 * is the kernel's limit (64 threads and processes under the runtime).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/wait.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>

static long futex(volatile int *word, int op, int val)
{
	return syscall(SYS_futex, word, op, val, NULL, NULL, 0);
}

static const char *errname(int e)
{
	switch (e) {
	case 0: return "0";
	case EAGAIN: return "EAGAIN";
	case ENOMEM: return "ENOMEM";
	case ESRCH: return "ESRCH";
	case EINVAL: return "EINVAL";
	case EPERM: return "EPERM";
	default: return strerror(e);
	}
}

/* A raw system call's result: "0" or the errno's name. */
static const char *result(long r)
{
	return r == 0 ? "0" : errname(errno);
}

static void pause_ms(int ms)
{
	struct timespec ts = {0, ms * 1000000L};
	nanosleep(&ts, NULL);
}

/* ---- limit ---- */

static volatile int gate;

static void *wait_at_gate(void *arg)
{
	(void)arg;
	while (!gate)
		futex(&gate, FUTEX_WAIT_PRIVATE, 0);
	return NULL;
}

static int limit(int n)
{
	pthread_t *t = calloc((size_t)n, sizeof *t);
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 64 * 1024);
	int made = 0, err = 0;
	while (made < n && (err = pthread_create(&t[made], &attr, wait_at_gate, NULL)) == 0)
		made++;
	if (err)
		printf("limit: %d threads, then %s\n", made, errname(err));
	else
		printf("limit: %d threads\n", made);
	gate = 1;
	futex(&gate, FUTEX_WAKE_PRIVATE, 1 << 30);
	for (int i = 0; i < made; i++)
		if (pthread_join(t[i], NULL)) {
			printf("limit: join %d failed\n", i);
			return 1;
		}
	printf("limit: all joined\n");
	pthread_t one;
	err = pthread_create(&one, &attr, wait_at_gate, NULL);
	printf("limit: one more thread: %s\n", errname(err));
	if (!err)
		pthread_join(one, NULL);
	/* Threads that come and go never run out. */
	int again = 0;
	for (int i = 0; i < 2 * n; i++) {
		if (pthread_create(&one, &attr, wait_at_gate, NULL))
			break;
		pthread_join(one, NULL);
		again++;
	}
	printf("limit: %d more, one at a time\n", again);
	return 0;
}

/* ---- forks ---- */

static int forks(int n)
{
	pid_t *kids = calloc((size_t)n, sizeof *kids);
	int gate[2];
	if (!kids || pipe(gate))
		return 1;
	int made = 0, err = 0;
	while (made < n) {
		pid_t p = fork();
		if (p < 0) {
			err = errno;
			break;
		}
		if (p == 0) {
			char c;
			close(gate[1]);
			_exit(read(gate[0], &c, 1) == 0 ? 0 : 1);
		}
		kids[made++] = p;
	}
	if (err)
		printf("forks: %d children, then %s\n", made, errname(err));
	else
		printf("forks: %d children\n", made);
	close(gate[1]);
	int bad = 0;
	for (int i = 0; i < made; i++) {
		int st = 0;
		if (waitpid(kids[i], &st, 0) != kids[i] || !WIFEXITED(st) || WEXITSTATUS(st))
			bad++;
	}
	printf("forks: all reaped, %d ended badly\n", bad);
	pid_t one = fork();
	if (one == 0)
		_exit(0);
	int st = -1;
	if (one > 0)
		waitpid(one, &st, 0);
	printf("forks: one more: %s, status %d\n", one > 0 ? "made" : errname(errno), st);
	/* Processes that come and go never run out. */
	int again = 0;
	for (int i = 0; i < 2 * n; i++) {
		pid_t p = fork();
		if (p < 0)
			break;
		if (p == 0)
			_exit(0);
		waitpid(p, NULL, 0);
		again++;
	}
	printf("forks: %d more, one at a time\n", again);
	return 0;
}

/* Every process forks for ever. */
static _Noreturn int bomb(void)
{
	printf("bomb: forking\n");
	for (;;)
		fork();
}

/* ---- dead ---- */

static volatile int tid_of_dead, tid_of_live, live_ready, live_release;

static void *note_tid_and_end(void *arg)
{
	(void)arg;
	tid_of_dead = gettid();
	return NULL;
}

static void *live(void *arg)
{
	(void)arg;
	tid_of_live = gettid();
	live_ready = 1;
	futex(&live_ready, FUTEX_WAKE_PRIVATE, 1);
	while (!live_release)
		futex(&live_release, FUTEX_WAIT_PRIVATE, 0);
	return NULL;
}

/* tgkill(pid, tid, 0) once the thread is gone: a join returns when its
 * tid word is cleared, and the thread may take a moment more to be gone
 * (on Linux too). */
static long gone(pid_t pid, int tid)
{
	long r = 0;
	for (int i = 0; i < 1000 && (r = syscall(SYS_tgkill, pid, tid, 0)) == 0; i++)
		sched_yield();
	return r;
}

static int dead(void)
{
	pthread_t l, d;
	signal(SIGUSR1, SIG_IGN);
	pthread_create(&l, NULL, live, NULL);
	while (!live_ready)
		futex(&live_ready, FUTEX_WAIT_PRIVATE, 0);
	pthread_create(&d, NULL, note_tid_and_end, NULL);
	pthread_join(d, NULL);
	pid_t pid = getpid();
	long r = gone(pid, tid_of_dead);
	printf("dead: tgkill(pid, dead tid, 0): %s\n", result(r));
	r = syscall(SYS_tgkill, pid, tid_of_dead, SIGUSR1);
	printf("dead: tgkill(pid, dead tid, SIGUSR1): %s\n", result(r));
	r = syscall(SYS_tkill, tid_of_dead, SIGUSR1);
	printf("dead: tkill(dead tid, SIGUSR1): %s\n", result(r));
	r = syscall(SYS_tkill, tid_of_dead, 0);
	printf("dead: tkill(dead tid, 0): %s\n", result(r));
	r = syscall(SYS_tgkill, pid, tid_of_dead, 1000);
	printf("dead: tgkill(pid, dead tid, 1000): %s\n", result(r));
	r = syscall(SYS_tgkill, pid, tid_of_live, 1000);
	printf("dead: tgkill(pid, live tid, 1000): %s\n", result(r));
	r = syscall(SYS_tgkill, pid, tid_of_live, 0);
	printf("dead: tgkill(pid, live tid, 0): %s\n", result(r));
	r = syscall(SYS_tgkill, pid, tid_of_live, SIGUSR1);
	printf("dead: tgkill(pid, live tid, SIGUSR1 ignored): %s\n", result(r));
	live_release = 1;
	futex(&live_release, FUTEX_WAKE_PRIVATE, 1);
	pthread_join(l, NULL);
	gone(pid, tid_of_live);
	r = syscall(SYS_tgkill, pid, tid_of_live, SIGUSR1);
	printf("dead: tgkill(pid, joined tid, SIGUSR1): %s\n", result(r));
	return 0;
}

/* ---- cleartid ---- */

#define WAITERS 3

static volatile int cleared_word, waiting;

static void *exit_with_cleartid(void *arg)
{
	(void)arg;
	/* The kernel clears and wakes this word when the thread ends (the
	 * thread is detached: its own tid word is no longer glibc's). */
	cleared_word = (int)syscall(SYS_set_tid_address, &cleared_word);
	while (__atomic_load_n(&waiting, __ATOMIC_SEQ_CST) < WAITERS)
		sched_yield();
	pause_ms(20); /* let the last waiter reach FUTEX_WAIT */
	syscall(SYS_exit, 0);
	return NULL;
}

static void *wait_on_cleartid(void *arg)
{
	(void)arg;
	int v;
	__atomic_add_fetch(&waiting, 1, __ATOMIC_SEQ_CST);
	while ((v = cleared_word) != 0)
		futex(&cleared_word, FUTEX_WAIT, v);
	/* The kernel woke one waiter: wake the rest. */
	futex(&cleared_word, FUTEX_WAKE, 1 << 30);
	return NULL;
}

static int cleartid(void)
{
	pthread_t t[WAITERS], x;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	cleared_word = -1;
	pthread_create(&x, &attr, exit_with_cleartid, NULL);
	for (int i = 0; i < WAITERS; i++)
		pthread_create(&t[i], NULL, wait_on_cleartid, NULL);
	for (int i = 0; i < WAITERS; i++)
		pthread_join(t[i], NULL);
	printf("cleartid: %d waiters woke, word %d\n", WAITERS, cleared_word);
	return 0;
}

/* ---- robust ---- */

static pthread_mutex_t robust_lock;
static volatile int holding;
static int owner_dead, locked;

static void *hold_and_die(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&robust_lock);
	holding = 1;
	while (__atomic_load_n(&waiting, __ATOMIC_SEQ_CST) < WAITERS)
		sched_yield();
	pause_ms(20); /* let the waiters reach FUTEX_WAIT */
	return NULL; /* still holding it */
}

static void *take_robust(void *arg)
{
	(void)arg;
	__atomic_add_fetch(&waiting, 1, __ATOMIC_SEQ_CST);
	int e = pthread_mutex_lock(&robust_lock);
	if (e == EOWNERDEAD) {
		owner_dead++;
		pthread_mutex_consistent(&robust_lock);
	} else if (e) {
		printf("robust: lock: %s\n", errname(e));
		return NULL;
	}
	locked++;
	pthread_mutex_unlock(&robust_lock);
	return NULL;
}

static int robust(void)
{
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&robust_lock, &a);
	pthread_t h, t[WAITERS];
	pthread_create(&h, NULL, hold_and_die, NULL);
	while (!holding)
		sched_yield();
	for (int i = 0; i < WAITERS; i++)
		pthread_create(&t[i], NULL, take_robust, NULL);
	pthread_join(h, NULL);
	for (int i = 0; i < WAITERS; i++)
		pthread_join(t[i], NULL);
	printf("robust: EOWNERDEAD %d time(s), locked %d times\n", owner_dead, locked);
	return 0;
}

/* ---- main-exits ---- */

static volatile int late_word;

static void *wait_late(void *arg)
{
	(void)arg;
	while (!late_word)
		futex(&late_word, FUTEX_WAIT_PRIVATE, 0);
	printf("main-exits: the waiter woke after the main thread ended\n");
	return NULL;
}

static void *wake_late(void *arg)
{
	(void)arg;
	pause_ms(50);
	late_word = 1;
	futex(&late_word, FUTEX_WAKE_PRIVATE, 1);
	return NULL;
}

static int main_exits(void)
{
	pthread_t a, b;
	pthread_create(&a, NULL, wait_late, NULL);
	pthread_create(&b, NULL, wake_late, NULL);
	printf("main-exits: the main thread ends\n");
	fflush(stdout);
	pthread_exit(NULL);
}

/* ---- abandon ---- */

static volatile int never[WAITERS];

static void *wait_forever(void *arg)
{
	volatile int *w = arg;
	__atomic_add_fetch(&waiting, 1, __ATOMIC_SEQ_CST);
	for (;;)
		futex(w, FUTEX_WAIT_PRIVATE, 0);
	return NULL;
}

static int abandon(void)
{
	pthread_t t[WAITERS];
	for (int i = 0; i < WAITERS; i++)
		pthread_create(&t[i], NULL, wait_forever, (void *)&never[i]);
	while (__atomic_load_n(&waiting, __ATOMIC_SEQ_CST) < WAITERS)
		sched_yield();
	pause_ms(20);
	printf("abandon: leaving %d waiters\n", WAITERS);
	return 0;
}

static struct sockaddr_in loopback(int fd)
{
	struct sockaddr_in a;
	socklen_t len = sizeof a;
	getsockname(fd, (struct sockaddr *)&a, &len);
	return a;
}

static int tcp_listener(void)
{
	int l = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 16))
		return -1;
	return l;
}

static int wait_fd(int fd, short ev)
{
	struct pollfd p = {fd, ev, 0};
	return poll(&p, 1, 2000) == 1 ? p.revents : 0;
}

#define MAX_SOCKS 4096

static int socks(void)
{
	static int fds[MAX_SOCKS];
	int n = 0, err = 0;
	/* Linux's default limit, whatever the shell's. */
	struct rlimit lim = {1024, 1024};
	setrlimit(RLIMIT_NOFILE, &lim);
	/* Listeners and bound UDP sockets until one is refused. */
	while (n < MAX_SOCKS) {
		int fd;
		if (n % 2) {
			fd = socket(AF_INET, SOCK_DGRAM, 0);
			struct sockaddr_in a = {.sin_family = AF_INET};
			if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a)) {
				err = errno;
				close(fd);
				break;
			}
		} else {
			fd = tcp_listener();
		}
		if (fd < 0) {
			err = errno;
			break;
		}
		fds[n++] = fd;
	}
	printf("sockets: ran out: %s\n",
	       err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM ? "yes" : errname(err));
	for (int i = 0; i < n; i++)
		close(fds[i]);

	/* A server, clients left half-open (connected, a partial request,
	 * never more), and one that vanishes mid-request with a reset. */
	int l = tcp_listener();
	struct sockaddr_in la = loopback(l);
	int half[8];
	for (int i = 0; i < 8; i++) {
		half[i] = socket(AF_INET, SOCK_STREAM, 0);
		connect(half[i], (struct sockaddr *)&la, sizeof la);
		write(half[i], "GET / HT", 8);
	}
	int gone = socket(AF_INET, SOCK_STREAM, 0);
	connect(gone, (struct sockaddr *)&la, sizeof la);
	write(gone, "GET /", 5);
	struct linger lin = {1, 0};
	setsockopt(gone, SOL_SOCKET, SO_LINGER, &lin, sizeof lin);
	close(gone);
	int accepted = 0, answered = 0;
	for (;;) {
		if (!(wait_fd(l, POLLIN) & POLLIN))
			break;
		int a = accept4(l, NULL, NULL, SOCK_NONBLOCK);
		if (a < 0)
			break;
		accepted++;
		char buf[64];
		wait_fd(a, POLLIN);
		ssize_t r = read(a, buf, sizeof buf);
		if (r > 0)
			answered++;
		close(a);
	}
	printf("sockets: accepted the half-open and the vanished: %s\n", accepted == 9 ? "yes" : "no");
	(void)answered;
	for (int i = 0; i < 8; i++)
		close(half[i]);

	/* Everything closed: a new connection still carries data. */
	int c = socket(AF_INET, SOCK_STREAM, 0);
	connect(c, (struct sockaddr *)&la, sizeof la);
	write(c, "ping", 4);
	wait_fd(l, POLLIN);
	int a = accept(l, NULL, NULL);
	char buf[8] = {0};
	wait_fd(a, POLLIN);
	ssize_t r = read(a, buf, sizeof buf);
	printf("sockets: a new connection carries data: %s\n",
	       r == 4 && !memcmp(buf, "ping", 4) ? "yes" : "no");
	close(a);
	close(c);
	close(l);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	const char *what = argc > 1 ? argv[1] : "";
	if (!strcmp(what, "limit"))
		return limit(argc > 2 ? atoi(argv[2]) : 100);
	if (!strcmp(what, "dead"))
		return dead();
	if (!strcmp(what, "cleartid"))
		return cleartid();
	if (!strcmp(what, "robust"))
		return robust();
	if (!strcmp(what, "main-exits"))
		return main_exits();
	if (!strcmp(what, "abandon"))
		return abandon();
	if (!strcmp(what, "sockets"))
		return socks();
	if (!strcmp(what, "forks"))
		return forks(argc > 2 ? atoi(argv[2]) : 100);
	if (!strcmp(what, "bomb") && getenv("PERCH_FUZZ_GUEST"))
		return bomb();
	fprintf(stderr, "usage: hostile limit N|dead|cleartid|robust|main-exits|abandon|sockets|forks N|bomb\n");
	return 2;
}
