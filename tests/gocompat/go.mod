module kmm.test/gocompat

go 1.26
