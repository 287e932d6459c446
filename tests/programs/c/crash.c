/*
 * crash: a process that must be killed, for Perch's isolation tests.
 *
 *   crash read ADDR     load 8 bytes from ADDR (hex)
 *   crash write ADDR    store 8 bytes to ADDR (hex)
 *   crash write-text    store to its own main()
 *   crash hog MIB       map MIB MiB of anonymous memory and touch every page
 *                       (under the runtime with less memory than that, it is
 *                       killed for want of memory; natively it exits 0)
 *
 * It prints what it is about to do (with the address, so the test can match
 * the reported fault) and then does it; the line after it is printed only
 * if the access did not fault. On Linux and under the runtime it ends with
 * SIGSEGV. Built with `gcc -static` (non-PIE, at 0x400000).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc == 3 && !strcmp(argv[1], "read")) {
		volatile uint64_t *p = (volatile uint64_t *)(uintptr_t)strtoull(argv[2], NULL, 16);
		printf("crash: reading 0x%llx\n", (unsigned long long)(uintptr_t)p);
		uint64_t v = *p;
		printf("crash: read 0x%llx: NOT KILLED\n", (unsigned long long)v);
	} else if (argc == 3 && !strcmp(argv[1], "write")) {
		volatile uint64_t *p = (volatile uint64_t *)(uintptr_t)strtoull(argv[2], NULL, 16);
		printf("crash: writing 0x%llx\n", (unsigned long long)(uintptr_t)p);
		*p = 0x5a5a5a5a5a5a5a5aull;
		printf("crash: wrote: NOT KILLED\n");
	} else if (argc == 2 && !strcmp(argv[1], "write-text")) {
		volatile unsigned char *p = (volatile unsigned char *)(uintptr_t)&main;
		printf("crash: writing 0x%llx\n", (unsigned long long)(uintptr_t)p);
		*p = 0xcc;
		printf("crash: wrote its own text: NOT KILLED\n");
	} else if (argc == 3 && !strcmp(argv[1], "hog")) {
		size_t len = (size_t)strtoull(argv[2], NULL, 10) << 20;
		printf("crash: touching %zu MiB\n", len >> 20);
		volatile unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
						 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p == MAP_FAILED) {
			printf("crash: mmap failed\n");
			return 1;
		}
		for (size_t i = 0; i < len; i += 4096)
			p[i] = 1;
		munmap((void *)p, len);
		printf("crash: touched all of it\n");
	} else {
		fprintf(stderr, "usage: crash read ADDR | write ADDR | write-text | hog MIB\n");
		return 2;
	}
	return 0;
}
