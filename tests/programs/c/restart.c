/*
 * restart: what a wait that a signal handler interrupts returns, as Linux
 * decides it. A helper thread sends SIGUSR1 to the main thread while it
 * waits, then ends the wait itself 50 ms later:
 *  - an untimed futex wait with an SA_RESTART handler is restarted (it
 *    ends when the helper wakes it, never with EINTR);
 *  - the same wait without SA_RESTART fails with EINTR;
 *  - a futex wait with a timeout, nanosleep and pause fail with EINTR even
 *    under SA_RESTART.
 * Then sigtimedwait: a blocked SIGUSR2 that is already pending is taken at
 * once, one another thread sends is taken when it comes (with its
 * siginfo), and a wait with nothing sent times out with EAGAIN.
 * One line per check, the same on every run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* <linux/futex.h>'s values: musl's headers do not carry the kernel's. */
#define FUTEX_WAIT_PRIVATE 128
#define FUTEX_WAKE_PRIVATE 129

static volatile sig_atomic_t handled;
static volatile int word;
static pthread_t main_thread;

static void on_usr1(int sig) { (void)sig; handled++; }

static void install(int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, 0);
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Signals the main thread after 30 ms, then ends its futex wait 50 ms later. */
static void *helper(void *arg) {
    (void)arg;
    sleep_ms(30);
    pthread_kill(main_thread, SIGUSR1);
    sleep_ms(50);
    __atomic_store_n(&word, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &word, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0);
    return 0;
}

static const char *outcome(long r, int err) {
    if (r == 0)
        return "woken";
    if (err == EINTR)
        return "EINTR";
    if (err == EAGAIN)
        return "woken"; /* restarted after the word changed */
    if (err == ETIMEDOUT)
        return "ETIMEDOUT";
    return strerror(err);
}

/* Waits in `what` while the helper signals, then ends the wait. */
static void check(const char *what, int flags) {
    pthread_t t;
    handled = 0;
    word = 0;
    install(flags);
    pthread_create(&t, 0, helper, 0);
    long r;
    if (strcmp(what, "futex") == 0) {
        r = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, 0, 0, 0);
    } else if (strcmp(what, "timed futex") == 0) {
        struct timespec ts = {5, 0};
        r = syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, &ts, 0, 0);
    } else if (strcmp(what, "nanosleep") == 0) {
        struct timespec ts = {5, 0};
        r = nanosleep(&ts, &ts);
    } else {
        r = pause();
    }
    int err = errno;
    pthread_join(t, 0);
    printf("%s%s: %s, handler ran %d time(s)\n", what,
           flags & SA_RESTART ? " (SA_RESTART)" : "", outcome(r, err), (int)handled);
}

/* Sends SIGUSR2 to the main thread after 30 ms. */
static void *sender(void *arg) {
    (void)arg;
    sleep_ms(30);
    pthread_kill(main_thread, SIGUSR2);
    return 0;
}

static void sigwait_checks(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &set, 0);
    siginfo_t info;
    struct timespec ts = {5, 0};
    raise(SIGUSR2);
    int r = sigtimedwait(&set, &info, &ts);
    printf("sigtimedwait, pending: %d, si_signo %d, si_code %s, si_pid %s\n", r, info.si_signo,
           /* glibc reports the tgkill's SI_TKILL as SI_USER */
           info.si_code == SI_TKILL || info.si_code == SI_USER ? "sent" : "other",
           info.si_pid == getpid() ? "ours" : "other");
    pthread_t t;
    pthread_create(&t, 0, sender, 0);
    memset(&info, 0, sizeof info);
    r = sigtimedwait(&set, &info, &ts);
    pthread_join(t, 0);
    printf("sigtimedwait, sent by a thread: %d, si_signo %d\n", r, info.si_signo);
    struct timespec short_ts = {0, 20000000};
    r = sigtimedwait(&set, &info, &short_ts);
    printf("sigtimedwait, nothing sent: %d, %s\n", r, r < 0 && errno == EAGAIN ? "EAGAIN" : "?");
}

int main(void) {
    main_thread = pthread_self();
    check("futex", SA_RESTART);
    check("futex", 0);
    check("timed futex", SA_RESTART);
    check("nanosleep", SA_RESTART);
    check("pause", SA_RESTART);
    sigwait_checks();
    puts("restart done");
    return 0;
}
