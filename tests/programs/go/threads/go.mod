module perch.test/threads

go 1.19
