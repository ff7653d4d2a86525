// placeholder so the layer library has a source; removed when the layer gets code.
