/* Processes that run other programs: `exec [ROUNDS]` forks four workers
 * that each execve `../bin/execwork` (the fourth `../bin/execwork-other`,
 * built for the other ABI) with their own arguments and a WORKER variable,
 * their stdout redirected into a pipe of their own with dup2, one
 * descriptor left open and one marked close-on-exec. The parent reads each
 * pipe to its end, prints every line it got, and reaps each worker with
 * wait4, printing its exit status. Then the calls that must fail: execve
 * of a missing file, of a directory, of a file without execute permission
 * and of a corrupt ELF (the errno each child reports through its exit
 * status), and a
 * script the program writes itself (`#!../bin/execwork script`), run with
 * an argument; posix_spawn with a file action, and vfork, whose child
 * shares the parent's memory until it execs. Every line is the same
 * natively and under the runtime. */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define WORKERS 4

extern char **environ;

/* Runs `path` with `args` in a child whose stdout goes into a pipe; prints
 * what it wrote and how it ended. */
static void run(const char *label, const char *path, char *const args[], char *const env[])
{
	int p[2];
	if (pipe(p)) {
		printf("%s: pipe: %s\n", label, strerror(errno));
		return;
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0) {
		printf("%s: fork: %s\n", label, strerror(errno));
		return;
	}
	if (pid == 0) {
		close(p[0]);
		if (dup2(p[1], 1) != 1)
			_exit(120);
		close(p[1]);
		execve(path, args, env);
		/* The errno says why, through the exit status. */
		_exit(errno);
	}
	close(p[1]);
	char buf[4096];
	size_t have = 0;
	for (;;) {
		ssize_t n = read(p[0], buf + have, sizeof buf - 1 - have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		have += (size_t)n;
	}
	close(p[0]);
	buf[have] = 0;
	for (char *l = strtok(buf, "\n"); l; l = strtok(NULL, "\n"))
		printf("%s said: %s\n", label, l);
	int st = 0;
	struct rusage ru;
	pid_t r = wait4(pid, &st, 0, &ru);
	if (r != pid)
		printf("%s: wait4: %d (%s)\n", label, (int)r, strerror(errno));
	else if (WIFEXITED(st))
		printf("%s: exit status %d\n", label, WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		printf("%s: killed by signal %d\n", label, WTERMSIG(st));
}

int main(int argc, char **argv)
{
	const char *rounds = argc > 1 ? argv[1] : "2000000";
	/* A descriptor the workers keep, and one that closes on exec. */
	int keep = open("input.txt", O_RDONLY);
	int gone = open("input.txt", O_RDONLY | O_CLOEXEC);
	if (keep < 0 || gone < 0) {
		printf("open input.txt: %s\n", strerror(errno));
		return 1;
	}
	char keep_s[16], gone_s[16];
	snprintf(keep_s, sizeof keep_s, "%d", keep);
	snprintf(gone_s, sizeof gone_s, "%d", gone);
	for (int i = 0; i < WORKERS; i++) {
		char name[16], n[32], status[16], env[32], label[32];
		snprintf(name, sizeof name, "w%d", i);
		snprintf(n, sizeof n, "%ld", atol(rounds) * (i + 1));
		snprintf(status, sizeof status, "%d", 10 + i);
		snprintf(env, sizeof env, "WORKER=%d", i);
		snprintf(label, sizeof label, "worker %d", i);
		const char *path = i == WORKERS - 1 ? "../bin/execwork-other" : "../bin/execwork";
		char *args[] = {"execwork", name, n, status, keep_s, gone_s, NULL};
		char *envp[] = {env, NULL};
		run(label, path, args, envp);
	}
	/* posix_spawn (glibc and musl: clone with CLONE_VM | CLONE_VFORK),
	 * its stdout into a pipe by a file action. */
	{
		int p[2];
		if (pipe(p) == 0) {
			posix_spawn_file_actions_t fa;
			posix_spawn_file_actions_init(&fa);
			posix_spawn_file_actions_adddup2(&fa, p[1], 1);
			posix_spawn_file_actions_addclose(&fa, p[0]);
			posix_spawn_file_actions_addclose(&fa, p[1]);
			char *args[] = {"execwork", "spawned", "1000", "21", NULL};
			char *envp[] = {"WORKER=spawned", NULL};
			pid_t pid;
			int err = posix_spawn(&pid, "../bin/execwork", &fa, NULL, args, envp);
			close(p[1]);
			printf("posix_spawn: %s\n", err ? strerror(err) : "ok");
			char buf[1024];
			ssize_t n, have = 0;
			while ((n = read(p[0], buf + have, sizeof buf - 1 - (size_t)have)) > 0)
				have += n;
			buf[have] = 0;
			close(p[0]);
			for (char *l = strtok(buf, "\n"); l; l = strtok(NULL, "\n"))
				printf("spawned said: %s\n", l);
			int st = 0;
			if (!err && waitpid(pid, &st, 0) == pid && WIFEXITED(st))
				printf("spawned: exit status %d\n", WEXITSTATUS(st));
			posix_spawn_file_actions_destroy(&fa);
		}
	}
	/* vfork: the child shares the parent's memory until it execs, and the
	 * parent waits until then. */
	{
		static volatile int seen;
		fflush(stdout);
		pid_t pid = vfork();
		if (pid == 0) {
			seen = 42;
			char *args[] = {"execwork", "vforked", "10", "22", NULL};
			char *envp[] = {NULL};
			int devnull = open("/dev/null", O_WRONLY);
			dup2(devnull, 1);
			execve("../bin/execwork", args, envp);
			_exit(127);
		}
		int st = 0;
		waitpid(pid, &st, 0);
		printf("vfork: the child's write is %s, exit status %d\n",
		       seen == 42 ? "seen" : "NOT SEEN", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	}
	/* What cannot run: the child's exit status is the errno. */
	char *none[] = {"x", NULL};
	run("missing", "../bin/no-such-program", none, environ);
	run("directory", "../bin", none, environ);
	run("not executable", "input.txt", none, environ);
	/* An ELF header over garbage, executable: ENOEXEC. */
	{
		static const unsigned char bad[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0,
						      0, 0, 0, 0, 2, 0, 0x3e, 0, 1, 0, 0, 0, 0xff};
		int fd = open("bad.elf", O_WRONLY | O_CREAT | O_TRUNC, 0755);
		if (fd < 0 || write(fd, bad, sizeof bad) != (ssize_t)sizeof bad || close(fd)) {
			printf("writing bad.elf: %s\n", strerror(errno));
			return 1;
		}
		run("corrupt", "./bad.elf", none, environ);
		unlink("bad.elf");
	}
	/* A script this program writes, under the archive's interpreter. */
	FILE *f = fopen("run.sh", "w");
	if (!f || fputs("#!../bin/execwork script\nnot read by execwork\n", f) < 0 || fclose(f)) {
		printf("writing run.sh: %s\n", strerror(errno));
		return 1;
	}
	chmod("run.sh", 0755);
	char *sargs[] = {"run.sh", "100", "7", NULL};
	char *senv[] = {"WORKER=script", NULL};
	run("script", "./run.sh", sargs, senv);
	unlink("run.sh");
	printf("exec done\n");
	return 0;
}
