/* A test program for kcore's host tests: prints what libc made of the initial stack, uses
 * TLS, a large heap and stdio, and exits with status 3. Run natively and under the loader,
 * its output must be the same. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

extern char **environ;
__thread int tls_value = 41;
static char bss[1 << 16];

int main(int argc, char **argv) {
    printf("argc %d\n", argc);
    for (int i = 0; i < argc; i++) printf("argv[%d] [%s]\n", i, argv[i]);
    for (char **e = environ; *e; e++) printf("env [%s]\n", *e);
    printf("pagesz %lu clktck %lu uid %lu euid %lu gid %lu egid %lu secure %lu\n",
           getauxval(AT_PAGESZ), getauxval(AT_CLKTCK), getauxval(AT_UID), getauxval(AT_EUID),
           getauxval(AT_GID), getauxval(AT_EGID), getauxval(AT_SECURE));
    printf("random %s execfn [%s] platform [%s]\n", getauxval(AT_RANDOM) ? "present" : "missing",
           (char *)getauxval(AT_EXECFN), (char *)getauxval(AT_PLATFORM));
    tls_value++;
    size_t big = 80u << 20;
    char *heap = malloc(big);
    if (!heap) { printf("malloc failed\n"); return 1; }
    memset(heap, 7, big);
    bss[100] = heap[big - 1];
    printf("tls %d heap %d bss %d\n", tls_value, heap[12345], bss[100]);
    return 3;
}
