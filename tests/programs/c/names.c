/* What a program learns of its names without a network: localhost and the
 * machine's own host name resolve (from /etc/hosts, at once, with no DNS
 * server to wait for), root is a user with a home, and service and protocol
 * names have their numbers. Built with musl (whose resolver and user
 * lookups read /etc directly); prints the same on any Linux host whose
 * /etc has the usual entries, except the host name's line. */
#include <arpa/inet.h>
#include <netdb.h>
#include <pwd.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* The IPv4 address `name` resolves to, or the error. */
static void resolve(const char *label, const char *name)
{
	struct addrinfo hints, *res = NULL;
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_INET;
	hints.ai_socktype = SOCK_STREAM;
	double t0 = now();
	int e = getaddrinfo(name, "http", &hints, &res);
	double took = now() - t0;
	if (e) {
		printf("%s: %s\n", label, gai_strerror(e));
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)res->ai_addr;
		char ip[INET_ADDRSTRLEN];
		inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
		printf("%s: %s port %d\n", label, ip, ntohs(a->sin_port));
		freeaddrinfo(res);
	}
	printf("%s: in under a second: %s\n", label, took < 1.0 ? "yes" : "no");
}

int main(void)
{
	char host[256] = "";
	gethostname(host, sizeof host);
	resolve("localhost", "localhost");
	resolve("own name", host);
	struct passwd *pw = getpwuid(0);
	printf("uid 0: %s %s\n", pw ? pw->pw_name : "none", pw ? pw->pw_dir : "-");
	struct group *gr = getgrgid(0);
	printf("gid 0: %s\n", gr ? gr->gr_name : "none");
	struct servent *se = getservbyname("https", "tcp");
	printf("https: %d\n", se ? ntohs(se->s_port) : -1);
	struct protoent *pe = getprotobyname("udp");
	printf("udp: %d\n", pe ? pe->p_proto : -1);
	return 0;
}
