// httpd: a Go net/http server for the networking tests. `httpd PORT`
// serves GOMAXPROCS goroutine-per-connection HTTP/1.1 (keep-alive) on
// 0.0.0.0:PORT: GET / answers a page rendered by renderPage (a checksum of
// a generated table, real work per request), GET /quit answers "bye" and
// ends the server with status 0 once the answer is out; anything else is
// 404. It prints "httpd: listening" once it listens and, at the end,
// "httpd: done" (the request count goes to stderr: it depends on the load).
package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
)

var served atomic.Int64

//go:noinline
func renderPage(n int) string {
	// A small table with a checksum, built afresh for each request.
	var sum uint32 = 2166136261
	buf := make([]byte, 0, 1024)
	for i := 0; i < n; i++ {
		line := strconv.Itoa(i*i) + "\n"
		for j := 0; j < len(line); j++ {
			sum = (sum ^ uint32(line[j])) * 16777619
		}
		if len(buf) < 512 {
			buf = append(buf, line...)
		}
	}
	return fmt.Sprintf("hello from go httpd\nchecksum %08x\n", sum)
}

//go:noinline
func handleRoot(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	served.Add(1)
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprint(w, renderPage(200))
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
	fmt.Fprintf(os.Stderr, "httpd: %d requests\n", served.Load())
	fmt.Println("httpd: done")
}
