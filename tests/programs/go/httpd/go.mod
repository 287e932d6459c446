module perch.test/httpd

go 1.19
