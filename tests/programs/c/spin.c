/*
 * spin: never makes a system call after its first line, for the preemption
 * test: the runtime must take the CPU back on its timer, the other
 * processes must keep running, and the run must end at `duration=`.
 */
#include <stdint.h>
#include <stdio.h>

int main(void)
{
	printf("spin: spinning without system calls\n");
	fflush(stdout);
	volatile uint64_t x = 0;
	for (;;)
		x++;
}
