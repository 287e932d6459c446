// threads: goroutines doing real work on four OS threads (GOMAXPROCS=4),
// with a channel, a mutex and a WaitGroup; every line it prints is the
// same on every run. `threads [ROUNDS]`: each goroutine's hashing steps
// (default 30,000,000).
package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
)

// work hashes `rounds` steps of FNV-1a from a seed (no allocation, so
// the goroutines run on their threads rather than in the collector).
func work(seed uint64, rounds int) uint64 {
	h := uint64(1469598103934665603) ^ seed
	for i := 0; i < rounds; i++ {
		h ^= uint64(i)
		h *= 1099511628211
	}
	return h
}

func main() {
	runtime.GOMAXPROCS(4)
	rounds := 30_000_000
	if len(os.Args) > 1 {
		n, err := strconv.Atoi(os.Args[1])
		if err != nil || n < 1 {
			fmt.Fprintln(os.Stderr, "usage: threads [ROUNDS]")
			os.Exit(2)
		}
		rounds = n
	}
	results := make(chan [2]uint64, 4)
	var mu sync.Mutex
	var total uint64
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			h := work(uint64(i), rounds)
			mu.Lock()
			total ^= h
			mu.Unlock()
			results <- [2]uint64{uint64(i), h & 0xffff}
		}(i)
	}
	wg.Wait()
	close(results)
	var got [4]uint64
	for r := range results {
		got[r[0]] = r[1]
	}
	for i, h := range got {
		fmt.Printf("goroutine %d: %04x\n", i, h)
	}
	fmt.Printf("total %016x\n", total)
	fmt.Println("go done")
}
