/*
 * netwait: sleeps for argv[1] milliseconds (default 2000) and says so,
 * giving the runtime's network time to come up while it waits (the test
 * of `perch record --net`).
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv)
{
	long ms = argc > 1 ? atol(argv[1]) : 2000;
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0)
		;
	printf("netwait: slept %ld ms\n", ms);
	return 0;
}
