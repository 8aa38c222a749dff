// An echo server on an outsourced UDP socket (protocol 253) served by Go's
// runtime: net.FilePacketConn hands the socket to the netpoller, which waits
// with edge-triggered epoll.  Prints "port N" once bound.  Built with Debian's
// golang on the host by tests/outsource/test_guest_vm.py, run in the guest by
// guest_boundary.py.
package main

import (
	"fmt"
	"net"
	"os"
	"syscall"
)

func main() {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_NONBLOCK, 253)
	if err != nil {
		fmt.Fprintln(os.Stderr, "et_echo_go: socket:", err)
		os.Exit(1)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		fmt.Fprintln(os.Stderr, "et_echo_go: bind:", err)
		os.Exit(1)
	}
	f := os.NewFile(uintptr(fd), "kbp_so")
	conn, err := net.FilePacketConn(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "et_echo_go: FilePacketConn:", err)
		os.Exit(1)
	}
	f.Close()
	fmt.Printf("port %d\n", conn.LocalAddr().(*net.UDPAddr).Port)
	buf := make([]byte, 2048)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			fmt.Fprintln(os.Stderr, "et_echo_go: ReadFrom:", err)
			os.Exit(1)
		}
		if _, err := conn.WriteTo(buf[:n], from); err != nil {
			fmt.Fprintln(os.Stderr, "et_echo_go: WriteTo:", err)
		}
	}
}
