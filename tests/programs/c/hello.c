/*
 * hello: built with plain `gcc` (dynamically linked, PT_INTERP) for the test
 * that the runtime refuses it with a message saying to link statically.
 */
#include <stdio.h>

int main(void)
{
	printf("hello from a dynamically linked program\n");
	return 0;
}
