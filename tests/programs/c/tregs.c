/*
 * tregs: two threads spin with their own known value in every
 * general-purpose register but RCX (the loop counter) and RSP, so that
 * each thread's samples can be checked register by register
 * (`perf script -F tid,sym,uregs`). Thread A holds 0xa1a1.. in RAX,
 * 0xa2a2.. in RBX and so on up to 0xaeae.. in R15 (RCX skipped, RSP not
 * counted); thread B holds 0xb1b1.. to 0xbebe... Each spins 200 rounds
 * of 50,000 iterations, yielding between rounds (the yield's SYSCALL
 * clobbers R11 and RCX; the next round loads them again). With the
 * argument `yield` each does 20,000 rounds of one iteration: it mostly
 * yields, so most samples land in the runtime, inside a thread's yield.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* Rounds per thread, and spin iterations per round. */
long tregs_rounds = 200;
long tregs_spins = 50000;

#define SPINNER(name, p)                                                      \
	__asm__(".intel_syntax noprefix\n"                                        \
		".text\n"                                                     \
		".balign 16\n"                                                \
		".globl " #name "\n"                                          \
		".type " #name ", @function\n" #name ":\n"                     \
		"push rbx\npush rbp\npush r12\npush r13\npush r14\npush r15\n" \
		"push qword ptr [rip + tregs_rounds]\n"                       \
		"1:\n"                                                        \
		"movabs rax, 0x" p "1" p "1" p "1" p "1" p "1" p "1" p "1" p "1\n" \
		"movabs rbx, 0x" p "2" p "2" p "2" p "2" p "2" p "2" p "2" p "2\n" \
		"movabs rdx, 0x" p "4" p "4" p "4" p "4" p "4" p "4" p "4" p "4\n" \
		"movabs rsi, 0x" p "5" p "5" p "5" p "5" p "5" p "5" p "5" p "5\n" \
		"movabs rdi, 0x" p "6" p "6" p "6" p "6" p "6" p "6" p "6" p "6\n" \
		"movabs rbp, 0x" p "7" p "7" p "7" p "7" p "7" p "7" p "7" p "7\n" \
		"movabs r8, 0x" p "8" p "8" p "8" p "8" p "8" p "8" p "8" p "8\n"  \
		"movabs r9, 0x" p "9" p "9" p "9" p "9" p "9" p "9" p "9" p "9\n"  \
		"movabs r10, 0x" p "a" p "a" p "a" p "a" p "a" p "a" p "a" p "a\n" \
		"movabs r11, 0x" p "b" p "b" p "b" p "b" p "b" p "b" p "b" p "b\n" \
		"movabs r12, 0x" p "c" p "c" p "c" p "c" p "c" p "c" p "c" p "c\n" \
		"movabs r13, 0x" p "d" p "d" p "d" p "d" p "d" p "d" p "d" p "d\n" \
		"movabs r14, 0x" p "e" p "e" p "e" p "e" p "e" p "e" p "e" p "e\n" \
		"movabs r15, 0x" p "f" p "f" p "f" p "f" p "f" p "f" p "f" p "f\n" \
		"mov rcx, qword ptr [rip + tregs_spins]\n"                    \
		".size " #name ", . - " #name "\n"                            \
		".globl " #name "_spin\n"                                     \
		".type " #name "_spin, @function\n" #name "_spin:\n"          \
		"dec rcx\n"                                                   \
		"jnz " #name "_spin\n"                                        \
		".size " #name "_spin, . - " #name "_spin\n"                  \
		/* The yield clobbers RAX, RCX and R11: its own symbol. */    \
		".globl " #name "_yield\n"                                    \
		".type " #name "_yield, @function\n" #name "_yield:\n"        \
		"mov eax, 24\n"                                               \
		"syscall\n"                                                   \
		"dec qword ptr [rsp]\n"                                       \
		"jnz 1b\n"                                                    \
		"add rsp, 8\n"                                                \
		"pop r15\npop r14\npop r13\npop r12\npop rbp\npop rbx\n"      \
		"ret\n"                                                       \
		".size " #name "_yield, . - " #name "_yield\n"                \
		".att_syntax prefix\n")

SPINNER(tregs_a, "a");
SPINNER(tregs_b, "b");

void tregs_a(void);
void tregs_b(void);

static void *run(void *spin)
{
	((void (*)(void))spin)();
	return 0;
}

int main(int argc, char **argv)
{
	pthread_t a, b;
	if (argc > 1 && strcmp(argv[1], "yield") == 0) {
		tregs_rounds = 20000;
		tregs_spins = 1;
	}
	pthread_create(&a, 0, run, (void *)tregs_a);
	pthread_create(&b, 0, run, (void *)tregs_b);
	pthread_join(a, 0);
	pthread_join(b, 0);
	puts("tregs done");
	return 0;
}
