module perch.test/spawn

go 1.19
