/*
 * appcheck: an ordinary C program for Perch's end-to-end tests.
 *
 * Built three ways by the tests (musl-gcc -static, gcc -static, gcc -m32
 * -static), run natively and under the runtime; both runs must print the
 * same bytes and exit with the same status. Every line it prints is
 * deterministic: no addresses, pids or times, only yes/no for the clocks.
 *
 *   appcheck DIR FILE...
 *
 * For each FILE (a relative path) it prints the size, line count and FNV-1a
 * checksum; then the sorted entries of DIR (readdir, i.e. getdents64);
 * touches 80 MiB of heap; checks the clocks; creates a new file, writes it,
 * reads it back and compares; prints argv and the variable PERCH_GREETING;
 * says one line on stderr; and exits with status 3.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HEAP_BYTES (80u << 20)

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static int check_file(const char *path)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0) {
		printf("file %s: open failed: %s\n", path, strerror(errno));
		return 1;
	}
	unsigned char buf[4096];
	uint64_t h = 0xcbf29ce484222325ull, size = 0, lines = 0;
	for (;;) {
		ssize_t n = read(fd, buf, sizeof buf);
		if (n < 0) {
			printf("file %s: read failed: %s\n", path, strerror(errno));
			close(fd);
			return 1;
		}
		if (n == 0)
			break;
		h = fnv1a(h, buf, (size_t)n);
		size += (uint64_t)n;
		for (ssize_t i = 0; i < n; i++)
			lines += buf[i] == '\n';
	}
	close(fd);
	struct stat st;
	if (stat(path, &st) != 0 || (uint64_t)st.st_size != size) {
		printf("file %s: stat disagrees with read\n", path);
		return 1;
	}
	printf("file %s: %llu bytes, %llu lines, fnv1a %016llx\n", path,
	       (unsigned long long)size, (unsigned long long)lines,
	       (unsigned long long)h);
	return 0;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int list_dir(const char *path)
{
	DIR *d = opendir(path);
	if (!d) {
		printf("dir %s: opendir failed: %s\n", path, strerror(errno));
		return 1;
	}
	char *names[256];
	size_t n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (n == 256)
			break;
		const char *kind = e->d_type == DT_DIR ? "/" : e->d_type == DT_REG ? "" : "?";
		size_t len = strlen(e->d_name) + 2;
		names[n] = malloc(len);
		if (!names[n])
			return 1;
		snprintf(names[n], len, "%s%s", e->d_name, kind);
		n++;
	}
	closedir(d);
	qsort(names, n, sizeof names[0], cmp_names);
	printf("dir %s: %zu entries:", path, n);
	for (size_t i = 0; i < n; i++) {
		printf(" %s", names[i]);
		free(names[i]);
	}
	printf("\n");
	return 0;
}

static int heap(void)
{
	uint64_t *p = malloc(HEAP_BYTES);
	if (!p) {
		printf("heap: malloc of %u MiB failed\n", HEAP_BYTES >> 20);
		return 1;
	}
	size_t words = HEAP_BYTES / sizeof *p;
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < words; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = x;
	}
	uint64_t sum = 0;
	for (size_t i = 0; i < words; i += 512 / sizeof *p)
		sum = sum * 31 + p[i];
	free(p);
	printf("heap: touched %u MiB, checksum %016llx\n", HEAP_BYTES >> 20,
	       (unsigned long long)sum);
	return 0;
}

static int clocks(void)
{
	struct timespec a, b, r;
	if (clock_gettime(CLOCK_MONOTONIC, &a) || clock_gettime(CLOCK_REALTIME, &r)) {
		printf("clocks: clock_gettime failed\n");
		return 1;
	}
	volatile uint64_t spin = 0;
	int advanced = 0;
	for (int round = 0; round < 1000 && !advanced; round++) {
		for (int i = 0; i < 100000; i++)
			spin += (uint64_t)i;
		if (clock_gettime(CLOCK_MONOTONIC, &b))
			return 1;
		advanced = b.tv_sec > a.tv_sec || (b.tv_sec == a.tv_sec && b.tv_nsec > a.tv_nsec);
	}
	/* 2020-01-01T00:00:00Z */
	printf("clocks: monotonic advances %s, realtime after 2020 %s\n",
	       advanced ? "yes" : "no", r.tv_sec > 1577836800 ? "yes" : "no");
	return 0;
}

static int new_file(const char *path)
{
	char text[3000];
	size_t len = 0;
	for (int i = 0; len + 40 < sizeof text; i++)
		len += (size_t)snprintf(text + len, sizeof text - len, "line %d of the new file\n", i);
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0644);
	if (fd < 0) {
		printf("new file %s: create failed: %s\n", path, strerror(errno));
		return 1;
	}
	if (write(fd, text, len) != (ssize_t)len) {
		printf("new file %s: write failed\n", path);
		return 1;
	}
	char back[sizeof text];
	if (lseek(fd, 0, SEEK_SET) != 0 || read(fd, back, sizeof back) != (ssize_t)len) {
		printf("new file %s: read back failed\n", path);
		return 1;
	}
	close(fd);
	int same = memcmp(text, back, len) == 0;
	/* Reopen and read again through a new descriptor. */
	fd = open(path, O_RDONLY);
	ssize_t again = fd < 0 ? -1 : read(fd, back, sizeof back);
	if (fd >= 0)
		close(fd);
	same = same && again == (ssize_t)len && memcmp(text, back, len) == 0;
	printf("new file %s: wrote %zu bytes, read back %s\n", path, len,
	       same ? "identical" : "DIFFERENT");
	return !same;
}

int main(int argc, char **argv)
{
	int failures = 0;
	printf("appcheck: %d args:", argc);
	for (int i = 0; i < argc; i++)
		printf(" [%s]", argv[i]);
	printf("\n");
	const char *greeting = getenv("PERCH_GREETING");
	printf("env PERCH_GREETING=%s\n", greeting ? greeting : "(unset)");
	if (argc < 3) {
		fprintf(stderr, "usage: appcheck DIR FILE...\n");
		return 2;
	}
	for (int i = 2; i < argc; i++)
		failures += check_file(argv[i]);
	failures += list_dir(argv[1]);
	failures += heap();
	failures += clocks();
	failures += new_file("appcheck-new.txt");
	printf("appcheck: %d failures\n", failures);
	fflush(stdout);
	fprintf(stderr, "appcheck: done, exiting with status 3\n");
	return failures ? 1 : 3;
}
