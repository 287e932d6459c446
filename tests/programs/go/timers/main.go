// timers: what Go's network poller carries (epoll_create1, eventfd2 or
// pipe2, epoll_ctl, epoll_pwait with a timeout): time.Sleep, time.After
// and a time.Timer in a select, a time.Ticker, and an os.Pipe written by
// one goroutine and read by another (the read end waits in the poller).
// Every line it prints is the same on every run.
package main

import (
	"fmt"
	"io"
	"os"
	"time"
)

func main() {
	start := time.Now()
	time.Sleep(20 * time.Millisecond)
	fmt.Println("slept at least 20ms:", time.Since(start) >= 20*time.Millisecond)

	// A timer wins a select against a channel nobody sends on.
	never := make(chan int)
	select {
	case <-never:
		fmt.Println("never")
	case <-time.After(30 * time.Millisecond):
		fmt.Println("time.After fired")
	}

	// A goroutine's send wins against a long timer.
	done := make(chan string)
	go func() {
		time.Sleep(10 * time.Millisecond)
		done <- "goroutine"
	}()
	t := time.NewTimer(10 * time.Second)
	select {
	case who := <-done:
		fmt.Println("first:", who)
	case <-t.C:
		fmt.Println("first: timer")
	}
	fmt.Println("timer stopped:", t.Stop())

	tick := time.NewTicker(5 * time.Millisecond)
	for i := 0; i < 3; i++ {
		<-tick.C
	}
	tick.Stop()
	fmt.Println("ticked 3 times")

	// A pipe across goroutines: the reader waits until the writer,
	// after a nap, writes; then the close ends it.
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Println("pipe:", err)
		os.Exit(1)
	}
	go func() {
		for i := 0; i < 3; i++ {
			time.Sleep(15 * time.Millisecond)
			fmt.Fprintf(w, "message %d\n", i)
		}
		w.Close()
	}()
	got, err := io.ReadAll(r)
	fmt.Printf("read %q err=%v\n", got, err)

	// A read deadline on the pipe: nothing comes, the poller times it out.
	r2, w2, _ := os.Pipe()
	r2.SetReadDeadline(time.Now().Add(25 * time.Millisecond))
	buf := make([]byte, 8)
	n, err := r2.Read(buf)
	fmt.Println("deadline read:", n, os.IsTimeout(err))
	w2.Close()
	r2.Close()
	fmt.Println("timers done")
}
