# A shell script as appliances start them, run by busybox sh: pipes,
# command substitution, subshells, redirections, a while-read loop over
# a pipe, background jobs and wait, exit statuses, a writer that outlives
# its reader (SIGPIPE), file copies and a trap. Every line it prints is the same
# natively and under the runtime.
set -u
echo "start in $(busybox basename "$(pwd)")"
sub=$(busybox echo nested "$(busybox echo deeper)")
echo "substitution: $sub"
echo "hello, world" | busybox tr a-z A-Z | busybox rev
(cd /; echo "subshell in $(pwd)"; exit 3)
echo "subshell status $?"
echo "back in $(busybox basename "$(pwd)")"
busybox seq 1 20 > numbers.txt
busybox wc -l < numbers.txt
echo "appended" >> numbers.txt
busybox tail -n 2 numbers.txt
busybox ls /no/such/dir 2> err.txt || echo "ls failed with $?"
busybox wc -l < err.txt
busybox printf 'pear\napple\nfig\n' | busybox sort | while read -r fruit; do
	echo "fruit: $fruit (${#fruit})"
done
total=0
busybox seq 1 5 > five.txt
while read -r n; do total=$((total + n)); done < five.txt
echo "total $total"
busybox sh -c 'exit 7' &
slow=$!
busybox sh -c 'echo "from the background"; exit 5' > bg.txt &
fast=$!
wait "$fast"
echo "fast job status $?"
wait "$slow"
echo "slow job status $?"
busybox cat bg.txt
for i in 1 2 3; do busybox sh -c "echo job $i" > "job$i.txt" & done
wait
busybox cat job1.txt job2.txt job3.txt | busybox sort
busybox seq 1 1000 | busybox awk '{ s += $1 } END { print "sum", s }'
# The reader goes first: the writer dies of SIGPIPE.
busybox yes | busybox head -n 2
busybox seq 1 300 | busybox md5sum
# cat and cp copy a file with sendfile.
busybox seq 1 2000 > many.txt
busybox cat many.txt > copy1.txt
busybox cp many.txt copy2.txt
busybox cat copy1.txt copy2.txt | busybox md5sum
busybox cmp many.txt copy2.txt && echo "copies agree"
trap 'echo "trap on exit"' EXIT
false || echo "false failed"
if busybox grep -q 17 numbers.txt; then echo "grep found 17"; fi
busybox rm -f numbers.txt five.txt err.txt bg.txt job1.txt job2.txt job3.txt \
	many.txt copy1.txt copy2.txt
echo done
