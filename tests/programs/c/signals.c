/*
 * signals: handlers as a Linux program uses them, with one line per check
 * and nothing that differs between runs.
 *  - SIGALRM from an ITIMER_REAL of 20 ms, five times, each awaited with
 *    pause();
 *  - a SIGSEGV handler (SA_SIGINFO) that checks si_addr and siglongjmp()s
 *    out of the fault;
 *  - SIGUSR1 sent with tgkill() to another thread, which spins until its
 *    handler ran;
 *  - a handler on a sigaltstack (SA_ONSTACK), for a signal raised by the
 *    main thread;
 *  - sigsuspend() with SIGUSR2 unblocked only while it waits;
 *  - a SA_SIGINFO handler that returns (through rt_sigreturn) after
 *    checking its siginfo, the mask its ucontext saved and the alignment
 *    of its stack.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>

static volatile sig_atomic_t alarms, usr1, usr1_on_alt, usr2;
static sigjmp_buf jump;
static char alt[65536];
static volatile int worker_ready;
static volatile pid_t worker_tid;

static void on_alarm(int sig) { (void)sig; alarms++; }

static void on_segv(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	siglongjmp(jump, si->si_addr == (void *)16 ? 1 : 2);
}

static void on_usr1(int sig)
{
	char here;
	(void)sig;
	usr1++;
	usr1_on_alt = &here >= alt && &here < alt + sizeof alt;
}

static void on_usr2(int sig) { (void)sig; usr2++; }

static volatile int winch_info, winch_mask, winch_aligned;

static void on_winch(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;
	/* Placed as if the stack were aligned as the ABI says at entry. */
	volatile char slot[16] __attribute__((aligned(16)));
	uintptr_t at = (uintptr_t)slot;
	/* Hides the address from the compiler, which knows it aligned. */
	__asm__("" : "+r"(at));
	slot[0] = 0;
	winch_info = si->si_signo == sig && si->si_code == SI_TKILL && si->si_pid == getpid();
	winch_mask = sigismember(&uc->uc_sigmask, SIGUSR2) && !sigismember(&uc->uc_sigmask, SIGWINCH);
	winch_aligned = at % 16 == 0;
}

static void *worker(void *arg)
{
	(void)arg;
	worker_tid = syscall(SYS_gettid);
	worker_ready = 1;
	while (!usr1)
		;
	return 0;
}

int main(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_alarm;
	sigaction(SIGALRM, &sa, 0);
	struct itimerval it = { { 0, 20000 }, { 0, 20000 } };
	setitimer(ITIMER_REAL, &it, 0);
	while (alarms < 5)
		pause();
	memset(&it, 0, sizeof it);
	setitimer(ITIMER_REAL, &it, 0);
	printf("SIGALRM from setitimer: %s\n", alarms >= 5 ? "five" : "fewer");

	sa.sa_sigaction = on_segv;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGSEGV, &sa, 0);
	/* Through a volatile pointer, so the compiler cannot see the fault. */
	int *volatile bad = (int *)16;
	int r = sigsetjmp(jump, 1);
	if (r == 0) {
		*bad = 1;
		puts("SIGSEGV: no fault");
	} else {
		printf("SIGSEGV handled, si_addr %s, siglongjmp out\n", r == 1 ? "right" : "wrong");
	}

	stack_t ss = { .ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0 };
	sigaltstack(&ss, 0);
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_usr1;
	sa.sa_flags = SA_ONSTACK;
	sigaction(SIGUSR1, &sa, 0);
	pthread_t t;
	pthread_create(&t, 0, worker, 0);
	while (!worker_ready)
		;
	syscall(SYS_tgkill, getpid(), worker_tid, SIGUSR1);
	pthread_join(t, 0);
	printf("SIGUSR1 by tgkill ran in the worker: %d\n", (int)usr1);
	raise(SIGUSR1);
	printf("SIGUSR1 on the sigaltstack: %s\n", usr1_on_alt ? "yes" : "no");

	sa.sa_handler = on_usr2;
	sa.sa_flags = 0;
	sigaction(SIGUSR2, &sa, 0);
	sigset_t block, wait;
	sigemptyset(&block);
	sigaddset(&block, SIGUSR2);
	sigprocmask(SIG_BLOCK, &block, 0);
	raise(SIGUSR2);
	printf("SIGUSR2 while blocked: %d\n", (int)usr2);
	sigemptyset(&wait);
	sigsuspend(&wait);
	printf("SIGUSR2 after sigsuspend: %d\n", (int)usr2);

	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_winch;
	sa.sa_flags = SA_SIGINFO;
	sigaction(SIGWINCH, &sa, 0);
	raise(SIGWINCH);
	printf("SA_SIGINFO handler returned: info %s, saved mask %s, stack %s\n",
	       winch_info ? "right" : "wrong", winch_mask ? "right" : "wrong",
	       winch_aligned ? "aligned" : "misaligned");
	sigset_t now;
	sigprocmask(SIG_SETMASK, 0, &now);
	printf("mask after it: SIGUSR2 %s, SIGWINCH %s\n",
	       sigismember(&now, SIGUSR2) ? "blocked" : "unblocked",
	       sigismember(&now, SIGWINCH) ? "blocked" : "unblocked");
	puts("signals done");
	return 0;
}
