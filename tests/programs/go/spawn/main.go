// spawn: Go's os/exec, which starts a program with clone(CLONE_VFORK |
// CLONE_VM) and execve, and reaps it with wait4: a child's output through
// a pipe, a failing child's exit status, stdin fed to a child, and a
// program that cannot be found.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

const busybox = "/bin/busybox"

func main() {
	out, err := exec.Command(busybox, "echo", "hello from a child").Output()
	fmt.Printf("output: %q, error: %v\n", out, err)

	cmd := exec.Command(busybox, "sh", "-c", "echo to stderr >&2; exit 3")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err = cmd.Run()
	fmt.Printf("exit: %v, code %d, stderr %q\n", err, cmd.ProcessState.ExitCode(), stderr.String())

	cmd = exec.Command(busybox, "tr", "a-z", "A-Z")
	cmd.Stdin = strings.NewReader("fed through a pipe\n")
	out, err = cmd.Output()
	fmt.Printf("tr: %q, error: %v\n", out, err)

	_, err = exec.Command("/bin/no-such-program").Output()
	fmt.Printf("missing: not found %v\n", errors.Is(err, os.ErrNotExist))

	fmt.Println("spawn done")
}
