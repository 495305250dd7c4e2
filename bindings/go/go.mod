module github.com/libllminfer/llminfer-go

go 1.19
