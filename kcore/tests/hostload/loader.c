/* A user-space stand-in for the runtime's loader, used by kcore's host tests: it maps a
 * program exactly as a kcore::elf::LoadPlan says, copies a kcore::initstack image below the
 * given stack top, and jumps to the entry point with the stack pointer at argc, so that the
 * real libc start code of the program reads the auxv, argv and envp kcore built.
 *
 * usage: loader PROGRAM IMAGE TOP SP ENTRY SEGMENT...
 * every number is hex; SEGMENT is VADDR:MEMSZ:FILE_OFFSET:FILESZ:PROT (PROT as PROT_* bits).
 * Linked at 0x20000000 (-Wl,-Ttext-segment) so that it stays clear of the program. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#define STACK_SIZE (1UL << 20)

static unsigned char *slurp(const char *path, unsigned long *len) {
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) { perror(path); exit(90); }
    unsigned char *buf = malloc(st.st_size ? st.st_size : 1);
    unsigned long done = 0;
    while (done < (unsigned long)st.st_size) {
        ssize_t n = read(fd, buf + done, st.st_size - done);
        if (n <= 0) { perror(path); exit(90); }
        done += n;
    }
    close(fd);
    *len = done;
    return buf;
}

static void *map_fixed(unsigned long start, unsigned long len) {
    void *m = mmap((void *)start, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (m != (void *)start) {
        fprintf(stderr, "loader: cannot map %#lx+%#lx\n", start, len);
        exit(91);
    }
    return m;
}

int main(int argc, char **argv) {
    if (argc < 7) { fprintf(stderr, "usage: loader PROGRAM IMAGE TOP SP ENTRY SEGMENT...\n"); return 92; }
    unsigned long file_len, image_len;
    unsigned char *file = slurp(argv[1], &file_len);
    unsigned char *image = slurp(argv[2], &image_len);
    unsigned long top = strtoul(argv[3], 0, 16);
    unsigned long sp = strtoul(argv[4], 0, 16);
    unsigned long entry = strtoul(argv[5], 0, 16);
    for (int i = 6; i < argc; i++) {
        unsigned long vaddr, memsz, offset, filesz;
        unsigned prot;
        if (sscanf(argv[i], "%lx:%lx:%lx:%lx:%x", &vaddr, &memsz, &offset, &filesz, &prot) != 5) {
            fprintf(stderr, "loader: bad segment %s\n", argv[i]);
            return 93;
        }
        unsigned long start = vaddr & ~4095UL;
        unsigned long end = (vaddr + memsz + 4095) & ~4095UL;
        map_fixed(start, end - start);
        if (offset + filesz > file_len) { fprintf(stderr, "loader: segment past the file\n"); return 94; }
        memcpy((void *)vaddr, file + offset, filesz);
        if (mprotect((void *)start, end - start, prot) != 0) { perror("mprotect"); return 95; }
    }
    map_fixed(top - STACK_SIZE, STACK_SIZE);
    if (sp + image_len != top) { fprintf(stderr, "loader: image does not end at the top\n"); return 96; }
    memcpy((void *)sp, image, image_len);
    fflush(stdout);
    fflush(stderr);
#if defined(__x86_64__)
    __asm__ volatile("mov %0, %%rsp\n\txor %%edx, %%edx\n\txor %%ebp, %%ebp\n\tjmp *%1"
                     :: "D"(sp), "S"(entry) : "memory");
#elif defined(__i386__)
    __asm__ volatile("mov %0, %%esp\n\txor %%edx, %%edx\n\txor %%ebp, %%ebp\n\tjmp *%1"
                     :: "D"(sp), "S"(entry) : "memory");
#else
#error "x86 only"
#endif
    return 97;
}
