export const PACKAGE_NAME = "@tapwire/stats";
