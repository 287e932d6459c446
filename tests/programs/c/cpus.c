/*
 * cpus: what a program learns of the machine's CPUs, and whether its threads
 * run on several: sched_getaffinity's count, get_nprocs() and
 * sysconf(_SC_NPROCESSORS_ONLN) agree; every sched_getcpu() answer lies
 * below that count; and four threads that spin for a while, each noting the
 * CPUs sched_getcpu() names, together see more than one; /proc/cpuinfo
 * names as many processors; and the main thread's stack is known to
 * pthread_getattr_np (glibc reads /proc/self/maps for it). One line per
 * check (yes or no, never a number, so the lines are the same on any
 * machine of two CPUs or more); `cpus done`.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#define THREADS 4

static volatile uint64_t seen[THREADS];
static volatile int bad_cpu;
static int online;

static void *spin(void *arg)
{
	unsigned i = (unsigned)(uintptr_t)arg;
	volatile uint64_t x = 0;
	for (unsigned round = 0; round < 2000; round++) {
		for (unsigned k = 0; k < 20000; k++)
			x += k;
		int cpu = sched_getcpu();
		if (cpu < 0 || cpu >= online || cpu >= 64)
			bad_cpu = 1;
		else
			seen[i] |= (uint64_t)1 << cpu;
	}
	return NULL;
}

int main(void)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	if (sched_getaffinity(0, sizeof set, &set) != 0) {
		perror("sched_getaffinity");
		return 1;
	}
	int affinity = CPU_COUNT(&set);
	online = (int)sysconf(_SC_NPROCESSORS_ONLN);
	printf("cpus: sched_getaffinity, get_nprocs and sysconf agree: %s\n",
	       affinity == online && get_nprocs() == online ? "yes" : "no");
	pthread_t t[THREADS];
	for (unsigned i = 0; i < THREADS; i++)
		pthread_create(&t[i], NULL, spin, (void *)(uintptr_t)i);
	for (unsigned i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	uint64_t all = 0;
	for (unsigned i = 0; i < THREADS; i++)
		all |= seen[i];
	printf("cpus: every sched_getcpu answer below the count: %s\n",
	       bad_cpu ? "no" : "yes");
	printf("cpus: the threads ran on more than one CPU: %s\n",
	       __builtin_popcountll(all) > 1 ? "yes" : "no");
	int processors = 0;
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[256];
	while (f && fgets(line, sizeof line, f))
		processors += strncmp(line, "processor", 9) == 0;
	if (f)
		fclose(f);
	printf("cpus: /proc/cpuinfo names each: %s\n", processors == online ? "yes" : "no");
	pthread_attr_t attr;
	void *stack = NULL;
	size_t size = 0;
	if (pthread_getattr_np(pthread_self(), &attr) == 0) {
		pthread_attr_getstack(&attr, &stack, &size);
		pthread_attr_destroy(&attr);
	}
	char here;
	printf("cpus: the main thread's stack is known: %s\n",
	       size > 0 && (char *)stack <= &here && &here < (char *)stack + size ? "yes" : "no");
	printf("cpus done\n");
	return 0;
}
