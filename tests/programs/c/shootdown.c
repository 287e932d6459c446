/*
 * shootdown: memory one thread takes away while another thread, running at
 * the same time (on another CPU under the runtime's sched=spread), keeps
 * using it. Every change must reach the other thread at once, as Linux's
 * TLB shootdowns make it: a CPU that kept a stale translation would let the
 * reader go on reading a page that is gone, or writing one made read-only.
 *
 * `shootdown [ROUNDS]` (default 20) runs ROUNDS rounds of each check:
 * - unmap: a reader thread spins reading a fresh page; the main thread
 *   unmaps it once the reader has read it many times. The reader's next
 *   reads must fault (SIGSEGV, caught with siglongjmp).
 * - protect: a writer thread spins writing a fresh page; the main thread
 *   makes it read-only. The writer's next writes must fault.
 * - unmap-write: a writer thread spins writing the first word of a fresh
 *   page; the main thread unmaps it, then takes and touches more fresh
 *   pages. The writer's next writes must fault, and none may reach the
 *   page's old memory once it is free again (the runtime keeps its free
 *   list in free pages: a late write there would wreck it).
 * - first-touch: four threads write the same fresh pages at once, so that
 *   two of them fault on one page together; the one that comes second
 *   finds it present and goes on. Every write must land.
 * The three checks run twice: as the scheduler places the two threads, then
 * with the toucher pinned to the first CPU and the main thread to the
 * second (the lines say "CPU 1 to CPU 0"), so that the change is made on
 * another CPU than the first and must reach the first one too (under the
 * runtime, the boot CPU). The pinned pass needs CPUs 0 and 1; without
 * them it prints "pinned: skipped (needs CPUs 0 and 1)" instead.
 * munmap and mprotect return only once every CPU dropped the old
 * translation, so the first access after the change faults; a thread that
 * goes on for 10,000 accesses after it reports a stale mapping. One line
 * per check; `shootdown done`; exit status 0, or 1 when a check failed.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define STALE_LIMIT 10000UL

static volatile uint64_t *page;
/* The CPU the toucher pins itself to, or -1 to leave it where it is. */
static int toucher_cpu = -1;
static volatile int phase;	/* 0 not started, 1 touching, 2 changed */
static volatile uint64_t touches;
static __thread sigjmp_buf env;
static __thread volatile int faulting;

static void on_segv(int sig)
{
	(void)sig;
	if (faulting)
		siglongjmp(env, 1);
	_exit(3);
}

enum check { UNMAP, PROTECT, UNMAP_WRITE, CHECKS };
static const char *const names[CHECKS] = { "unmap", "protect", "unmap-write" };

/* Moves the calling thread to CPU `cpu` alone; false when it cannot. */
static int pin_to(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return sched_setaffinity(0, sizeof set, &set) == 0;
}

/* Returns 0 when the change reached the thread (it faulted), 1 otherwise. */
static void *toucher(void *arg)
{
	enum check check = (enum check)(uintptr_t)arg;
	unsigned long after = 0;
	if (toucher_cpu >= 0 && !pin_to(toucher_cpu)) {
		perror("sched_setaffinity");
		exit(1);
	}
	faulting = 1;
	if (sigsetjmp(env, 1))
		return (void *)0;
	for (;;) {
		if (check == PROTECT)
			page[1] = touches;
		else if (check == UNMAP_WRITE)
			page[0] = 0xdeadbeefcafef00dULL ^ touches;
		else
			(void)page[0];
		touches++;
		if (phase == 0)
			phase = 1;
		if (phase == 2 && ++after > STALE_LIMIT)
			return (void *)1;
	}
}

/* Maps, touches and unmaps 16 fresh pages. */
static void churn(void)
{
	size_t len = 16 * 4096;
	volatile char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	for (size_t i = 0; i < len; i += 4096)
		p[i] = 1;
	munmap((void *)p, len);
}

static int round_of(enum check check)
{
	page = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
		    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (page == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	page[0] = 42;
	phase = 0;
	touches = 0;
	pthread_t t;
	if (pthread_create(&t, NULL, toucher, (void *)(uintptr_t)check) != 0) {
		fprintf(stderr, "pthread_create failed\n");
		exit(1);
	}
	/* Let the toucher use the page for a while. */
	while (phase == 0 || touches < 100000)
		;
	int r = check == PROTECT ? mprotect((void *)page, 4096, PROT_READ)
				 : munmap((void *)page, 4096);
	if (r != 0) {
		perror(check == PROTECT ? "mprotect" : "munmap");
		exit(1);
	}
	phase = 2;
	if (check == UNMAP_WRITE)
		churn();
	void *stale;
	pthread_join(t, &stale);
	if (check == PROTECT)
		munmap((void *)page, 4096);
	return stale != NULL;
}

/* Runs `rounds` rounds of each check, a line each (`where` follows the
 * check's name); returns 1 when any round saw a stale mapping. */
static int run_checks(int rounds, const char *where)
{
	int failed = 0;
	for (enum check c = UNMAP; c < CHECKS; c++) {
		int stale = 0;
		for (int i = 0; i < rounds; i++)
			stale += round_of(c);
		printf("%s%s: %d of %d rounds faulted after the change\n",
		       names[c], where, rounds - stale, rounds);
		failed |= stale != 0;
	}
	return failed;
}

#define TOUCHERS 4
#define TOUCH_PAGES 256
static volatile char *fresh;
static volatile int go;

static void *first_toucher(void *arg)
{
	size_t me = (size_t)(uintptr_t)arg;
	while (!go)
		;
	for (size_t i = 0; i < TOUCH_PAGES; i++)
		fresh[i * 4096 + me] = (char)(1 + me);
	return NULL;
}

/* Returns 0 when every thread's write to every page landed, 1 otherwise. */
static int first_touch_round(void)
{
	size_t len = TOUCH_PAGES * 4096;
	fresh = mmap(NULL, len, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (fresh == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	go = 0;
	pthread_t t[TOUCHERS];
	for (size_t i = 0; i < TOUCHERS; i++)
		if (pthread_create(&t[i], NULL, first_toucher,
				   (void *)(uintptr_t)i) != 0) {
			fprintf(stderr, "pthread_create failed\n");
			exit(1);
		}
	go = 1;
	for (size_t i = 0; i < TOUCHERS; i++)
		pthread_join(t[i], NULL);
	int missing = 0;
	for (size_t p = 0; p < TOUCH_PAGES; p++)
		for (size_t i = 0; i < TOUCHERS; i++)
			missing |= fresh[p * 4096 + i] != (char)(1 + i);
	munmap((void *)fresh, len);
	return missing;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 20;
	if (rounds < 1 || rounds > 1000) {
		fprintf(stderr, "usage: shootdown [ROUNDS 1..1000]\n");
		return 2;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_segv;
	sigaction(SIGSEGV, &sa, NULL);
	int failed = run_checks(rounds, "");
	cpu_set_t all;
	if (sched_getaffinity(0, sizeof all, &all) != 0) {
		perror("sched_getaffinity");
		return 1;
	}
	if (!CPU_ISSET(0, &all) || !CPU_ISSET(1, &all) || !pin_to(1)) {
		printf("pinned: skipped (needs CPUs 0 and 1)\n");
	} else {
		toucher_cpu = 0;
		failed |= run_checks(rounds, " (CPU 1 to CPU 0)");
		toucher_cpu = -1;
		if (sched_setaffinity(0, sizeof all, &all) != 0) {
			perror("sched_setaffinity");
			return 1;
		}
	}
	int lost = 0;
	for (int i = 0; i < rounds; i++)
		lost += first_touch_round();
	printf("first-touch: %d of %d rounds kept every write\n",
	       rounds - lost, rounds);
	failed |= lost != 0;
	printf("shootdown done\n");
	return failed;
}
