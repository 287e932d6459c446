// httpd: a Go net/http server for the networking tests. `httpd PORT`
// serves HTTP/1.1 (keep-alive, a goroutine per connection) on
// 0.0.0.0:PORT: GET / answers a line rendered by renderPage (a checksum of
// the digits of 2000 squares, the work of a request), GET /quit answers
// "bye" and shuts the server down, which then exits with status 0;
// anything else is 404. It prints "httpd: listening" once it listens and,
// at the end, "httpd: done" (the request count goes to stderr: it depends
// on the load).
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
)

var served atomic.Int64

//go:noinline
func renderPage(n int) string {
	// The digits of a table of squares, hashed (FNV-1a) as they would be
	// written out: the CPU work of a request.
	var sum uint32 = 2166136261
	for i := 0; i < n; i++ {
		x := uint32(i * i)
		for {
			sum = (sum ^ (x%10 + '0')) * 16777619
			x /= 10
			if x == 0 {
				break
			}
		}
		sum = (sum ^ '\n') * 16777619
	}
	return fmt.Sprintf("hello from go httpd\nrows %d checksum %08x\n", n, sum)
}

//go:noinline
func handleRoot(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	served.Add(1)
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprint(w, renderPage(2000))
}

func main() {
	port := "80"
	if len(os.Args) > 1 {
		port = os.Args[1]
	}
	done := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/", handleRoot)
	mux.HandleFunc("/quit", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		fmt.Fprint(w, "bye\n")
		select {
		case <-done:
		default:
			close(done)
		}
	})
	srv := &http.Server{Handler: mux}
	ln, err := net.Listen("tcp", ":"+port)
	if err != nil {
		fmt.Println("httpd:", err)
		os.Exit(1)
	}
	fmt.Println("httpd: listening")
	go func() {
		<-done
		srv.Shutdown(context.Background())
	}()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		fmt.Println("httpd:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "httpd: served %d requests\n", served.Load())
	fmt.Println("httpd: done")
}
