/* CPU affinity as programs use it: a thread pins itself with
 * sched_setaffinity and is on that CPU when the call returns; threads pinned
 * one to a CPU run only there; one thread pins another with
 * pthread_setaffinity_np, and the other moves there and stays; a parent pins
 * its child process by pid, and the child moves there; the masks read back
 * as set. Prints the same on any machine with two CPUs or more (the CPUs
 * are named by their place in the affinity mask, not by number). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define ROUNDS 20000000L

static int cpus[64];
static int ncpus;

static void pin_to(pthread_t t, int cpu)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	if (pthread_setaffinity_np(t, sizeof s, &s))
		printf("pthread_setaffinity_np failed\n");
}

/* Spins, and says whether every check saw CPU `cpu`. */
static int stays_on(int cpu)
{
	int ok = 1;
	volatile unsigned long h = 0;
	for (long i = 0; i < ROUNDS; i++) {
		h = h * 31 + (unsigned long)i;
		if (i % 1000 == 0 && sched_getcpu() != cpu)
			ok = 0;
	}
	return ok;
}

struct worker {
	pthread_t t;
	int k;
	int ok;
};

static void *pinned(void *arg)
{
	struct worker *w = arg;
	int cpu = cpus[w->k % ncpus];
	pin_to(pthread_self(), cpu);
	w->ok = sched_getcpu() == cpu && stays_on(cpu);
	return NULL;
}

static atomic_int moved_flag;

static void *moved(void *arg)
{
	struct worker *w = arg;
	while (!atomic_load(&moved_flag))
		;
	/* Pinned by main meanwhile: it gets there by the end of its slice,
	 * then stays. */
	int cpu = cpus[0];
	long spins = 0;
	while (sched_getcpu() != cpu && spins < 1000000000L)
		spins++;
	w->ok = sched_getcpu() == cpu && stays_on(cpu);
	return NULL;
}

int main(void)
{
	cpu_set_t all;
	if (sched_getaffinity(0, sizeof all, &all)) {
		printf("sched_getaffinity failed\n");
		return 1;
	}
	for (int c = 0; c < CPU_SETSIZE && ncpus < 64; c++)
		if (CPU_ISSET(c, &all))
			cpus[ncpus++] = c;
	if (ncpus < 2) {
		printf("needs two CPUs\n");
		return 1;
	}
	/* The caller pins itself to its last CPU. */
	int last = cpus[ncpus - 1];
	pin_to(pthread_self(), last);
	printf("self: on its CPU at return: %s\n", sched_getcpu() == last ? "yes" : "no");
	printf("self: stays there: %s\n", stays_on(last) ? "yes" : "no");
	cpu_set_t got;
	sched_getaffinity(0, sizeof got, &got);
	printf("self: mask reads back: %s\n",
	       CPU_COUNT(&got) == 1 && CPU_ISSET(last, &got) ? "yes" : "no");

	struct worker w[4];
	for (int k = 0; k < 4; k++) {
		w[k].k = k;
		pthread_create(&w[k].t, NULL, pinned, &w[k]);
	}
	for (int k = 0; k < 4; k++) {
		pthread_join(w[k].t, NULL);
		printf("thread %d: only on its CPU: %s\n", k, w[k].ok ? "yes" : "no");
	}

	/* Main pins another thread, by its tid. */
	struct worker m = {.k = 0};
	pin_to(pthread_self(), cpus[1]);
	pthread_create(&m.t, NULL, moved, &m);
	pin_to(m.t, cpus[0]);
	pthread_getaffinity_np(m.t, sizeof got, &got);
	printf("other: mask reads back: %s\n",
	       CPU_COUNT(&got) == 1 && CPU_ISSET(cpus[0], &got) ? "yes" : "no");
	atomic_store(&moved_flag, 1);
	pthread_join(m.t, NULL);
	printf("other: moved there and stayed: %s\n", m.ok ? "yes" : "no");

	/* Another process, by its pid: the child waits for its parent to pin
	 * it, then gets there (by the end of its slice) and stays. */
	int go[2];
	if (pipe(go)) {
		printf("pipe failed\n");
		return 1;
	}
	pid_t child = fork();
	if (child == 0) {
		char b;
		if (read(go[0], &b, 1) != 1)
			_exit(2);
		long spins = 0;
		while (sched_getcpu() != cpus[0] && spins < 1000000000L)
			spins++;
		_exit(sched_getcpu() == cpus[0] && stays_on(cpus[0]) ? 0 : 1);
	}
	cpu_set_t one;
	CPU_ZERO(&one);
	CPU_SET(cpus[0], &one);
	if (sched_setaffinity(child, sizeof one, &one))
		printf("sched_setaffinity of the child failed\n");
	CPU_ZERO(&got);
	sched_getaffinity(child, sizeof got, &got);
	printf("process: mask reads back: %s\n",
	       CPU_COUNT(&got) == 1 && CPU_ISSET(cpus[0], &got) ? "yes" : "no");
	if (write(go[1], "g", 1) != 1)
		printf("write failed\n");
	int status = 0;
	waitpid(child, &status, 0);
	printf("process: moved there and stayed: %s\n",
	       WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "yes" : "no");
	return 0;
}
