module perch.test/timers

go 1.19
