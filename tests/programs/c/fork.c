/* Processes that make processes: forks four workers that each compute a
 * checksum of their own share (CPU-bound: `work`), send it up a pipe that
 * all of them share, and end differently (exit statuses 1 to 3; the fourth
 * waits on a second pipe the parent holds until the parent kills it with
 * SIGTERM). The parent reads the pipe to its end, prints the lines in
 * worker order, and reaps each worker with waitpid or waitid, printing how
 * it ended; then checks what a copy must not share (a global the workers
 * changed), that a shared anonymous page has every worker's mark, the
 * ECHILD of a wait with no child left, and that SIGCHLD came.
 * Every line is the same natively and under the runtime.
 *
 * Argument: the rounds of the first worker (the k-th does k times as many;
 * default 200000). */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORKERS 4

static volatile sig_atomic_t sigchld;
static int global = 1;
/* Written by the runtime in each worker (pipe), alone in its page so that
 * no write of the worker's own comes first: never in the parent. */
static int kfds[1024] __attribute__((aligned(4096))) = {-7, -7};

static void on_chld(int sig)
{
	(void)sig;
	sigchld++;
}

/* FNV-1a over the round numbers, seeded by the worker. */
__attribute__((noinline)) static uint64_t work(int worker, long rounds)
{
	uint64_t h = 1469598103934665603ull ^ (uint64_t)worker;
	for (long r = 0; r < rounds; r++) {
		h ^= (uint64_t)r;
		h *= 1099511628211ull;
	}
	return h;
}

/* A shared anonymous page: each worker adds its number, the parent sees
 * every one (mapped before the fork, never touched by the parent). */
static volatile int *shared;

static void worker(int i, long rounds, pid_t parent, int out, int hold)
{
	__atomic_fetch_add(shared, 1 << i, __ATOMIC_SEQ_CST);
	global = 100 + i;
	if (pipe(kfds))
		_exit(103);
	uint64_t h = work(i, rounds * (i + 1));
	char line[96];
	int n = snprintf(line, sizeof line, "worker %d: %016llx, parent %s, global %d\n", i,
			 (unsigned long long)h, getppid() == parent ? "ok" : "NOT THE PARENT",
			 global);
	if (write(out, line, (size_t)n) != n)
		_exit(100);
	close(out);
	if (i < WORKERS - 1)
		_exit(i + 1);
	/* The last one waits on a pipe nobody writes until the parent kills
	 * it. */
	char c;
	(void)read(hold, &c, 1);
	_exit(101);
}

static void describe(int i, int st)
{
	if (WIFEXITED(st))
		printf("worker %d exited with status %d\n", i, WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		printf("worker %d killed by signal %d (%s)\n", i, WTERMSIG(st),
		       strsignal(WTERMSIG(st)));
	else
		printf("worker %d: status %#x\n", i, st);
}

int main(int argc, char **argv)
{
	long rounds = argc > 1 ? atol(argv[1]) : 200000;
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_chld;
	sa.sa_flags = SA_RESTART;
	sigaction(SIGCHLD, &sa, NULL);

	int out[2], hold[2];
	if (pipe(out) || pipe(hold)) {
		printf("pipe: %s\n", strerror(errno));
		return 1;
	}
	shared = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED)
		return 1;
	/* The parent has the page before it forks (so that it is shared). */
	if (*(volatile int *)&kfds[0] != -7)
		return 1;
	pid_t me = getpid();
	pid_t kids[WORKERS];
	fflush(stdout);
	for (int i = 0; i < WORKERS; i++) {
		pid_t p = fork();
		if (p < 0) {
			printf("fork: %s\n", strerror(errno));
			return 1;
		}
		if (p == 0) {
			close(out[0]);
			close(hold[1]);
			worker(i, rounds, me, out[1], hold[0]);
		}
		kids[i] = p;
	}
	close(out[1]);
	close(hold[0]);

	/* Every worker's line, to the end of the pipe (all write ends closed). */
	char lines[WORKERS][96];
	memset(lines, 0, sizeof lines);
	char buf[1024];
	size_t have = 0;
	for (;;) {
		ssize_t n = read(out[0], buf + have, sizeof buf - 1 - have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		have += (size_t)n;
	}
	buf[have] = 0;
	for (char *l = strtok(buf, "\n"); l; l = strtok(NULL, "\n")) {
		int w = -1;
		if (sscanf(l, "worker %d:", &w) == 1 && w >= 0 && w < WORKERS)
			snprintf(lines[w], sizeof lines[w], "%s", l);
	}
	for (int i = 0; i < WORKERS; i++)
		printf("%s\n", lines[i][0] ? lines[i] : "a worker's line is missing");

	/* The last worker waits on `hold`: not ended yet. */
	int st = 0;
	pid_t r = waitpid(kids[WORKERS - 1], &st, WNOHANG);
	printf("waitpid WNOHANG on a waiting worker: %d\n", (int)r);
	printf("kill: %d\n", kill(kids[WORKERS - 1], SIGTERM));
	close(hold[1]);

	/* The first through waitid, looked at twice (WNOWAIT), then taken. */
	siginfo_t si;
	memset(&si, 0, sizeof si);
	if (waitid(P_PID, (id_t)kids[0], &si, WEXITED | WNOWAIT) == 0)
		printf("waitid WNOWAIT: %s, code %d, status %d\n",
		       si.si_pid == kids[0] ? "that worker" : "another",
		       si.si_code, si.si_status);
	memset(&si, 0, sizeof si);
	if (waitid(P_PID, (id_t)kids[0], &si, WEXITED) == 0)
		printf("waitid: code %d, status %d\n", si.si_code, si.si_status);
	for (int i = 1; i < WORKERS; i++) {
		r = waitpid(kids[i], &st, 0);
		if (r != kids[i])
			printf("waitpid %d: %d (%s)\n", i, (int)r, strerror(errno));
		else
			describe(i, st);
	}
	r = wait(&st);
	printf("wait with no child left: %d (%s)\n", (int)r, r < 0 ? strerror(errno) : "?");
	printf("parent's global: %d\n", global);
	printf("parent's pipe words: %d %d\n", kfds[0], kfds[1]);
	printf("shared page: %#x\n", *shared);
	printf("SIGCHLD came: %s\n", sigchld > 0 ? "yes" : "no");
	printf("fork done\n");
	return 0;
}
