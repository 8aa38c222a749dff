// SPDX-License-Identifier: GPL-2.0-only
/*
 * An edge-triggered epoll UDP echo server on an outsourced socket (protocol
 * 253), as nginx- or libuv-style event loops read: EPOLLIN | EPOLLET, drain
 * until EAGAIN, wait again.  Prints "port N" once bound.  Run in the guest
 * by tests/outsource/guest_boundary.py; exits on SIGTERM/SIGKILL.
 */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

int main(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct epoll_event ev = { .events = EPOLLIN | EPOLLET };
	socklen_t len = sizeof(a);
	int s, ep;

	s = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 253);
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) ||
	    getsockname(s, (struct sockaddr *)&a, &len)) {
		perror("et_echo: socket");
		return 1;
	}
	ep = epoll_create1(0);
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev)) {
		perror("et_echo: epoll");
		return 1;
	}
	printf("port %d\n", ntohs(a.sin_port));
	fflush(stdout);
	for (;;) {
		struct epoll_event out;

		if (epoll_wait(ep, &out, 1, -1) < 0) {
			if (errno == EINTR)
				continue;
			perror("et_echo: epoll_wait");
			return 1;
		}
		for (;;) {
			struct sockaddr_in from;
			socklen_t flen = sizeof(from);
			char buf[2048];
			ssize_t n = recvfrom(s, buf, sizeof(buf), 0, (struct sockaddr *)&from, &flen);

			if (n < 0) {
				if (errno == EAGAIN)
					break;	/* edge-triggered: wait for the next edge */
				perror("et_echo: recvfrom");
				return 1;
			}
			if (sendto(s, buf, n, 0, (struct sockaddr *)&from, flen) < 0)
				perror("et_echo: sendto");
		}
	}
}
